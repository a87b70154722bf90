package liveness

import "testing"

// A resync (the listening session dropped or came back) wakes the waiters that re-read
// on it, not those whose wake-up means that a thing happened: a follower that took each
// resync for taken:<lease> gave up the try it was about to make. And the watcher's
// dead:here can never come from a payload.
func TestResyncWakesOnlyTheWaitersThatReadAgain(t *testing.T) {
	var h events
	isTaken := func(ev event) bool { return ev.Kind == eventTaken && ev.ID == "job" }
	reread, unsubscribeReread := h.subscribe(isTaken)
	defer unsubscribeReread()
	news, unsubscribeNews := h.subscribeNews(isTaken)
	defer unsubscribeNews()
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	h.publish(event{Kind: eventResync})
	if !woken(reread) {
		t.Error("a resync did not wake a subscribe waiter")
	}
	if woken(news) {
		t.Error("a resync woke a subscribeNews waiter: it would take it for taken:job")
	}
	h.publish(event{Kind: eventTaken, ID: "other"})
	if woken(reread) || woken(news) {
		t.Error("taken:other woke a waiter for taken:job")
	}
	h.publish(event{Kind: eventTaken, ID: "job"})
	if !woken(reread) || !woken(news) {
		t.Error("taken:job did not wake both waiters")
	}

	for _, payload := range []string{"dead:here", eventDeadHere + ":x", "dead:here:"} {
		if ev, ok := parseEvent(payload); ok && ev.Kind == eventDeadHere {
			t.Errorf("payload %q parsed as the watcher's own %q", payload, eventDeadHere)
		}
	}
}
