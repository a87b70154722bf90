package notify

import "testing"

// A resync (the listening session dropped or came back) wakes the waiters that re-read
// on it, not those whose wake-up means that a thing happened: a follower that took each
// resync for taken:<lease> gave up the try it was about to make. And the watcher's
// dead:here can never come from a payload.
func TestResyncWakesOnlyTheWaitersThatReadAgain(t *testing.T) {
	var h Hub
	isTaken := func(ev Event) bool { return ev.Kind == Taken && ev.ID == "job" }
	reread, unsubscribeReread := h.Subscribe(isTaken)
	defer unsubscribeReread()
	news, unsubscribeNews := h.SubscribeNews(isTaken)
	defer unsubscribeNews()
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	h.Publish(Event{Kind: Resync})
	if !woken(reread) {
		t.Error("a resync did not wake a Subscribe waiter")
	}
	if woken(news) {
		t.Error("a resync woke a SubscribeNews waiter: it would take it for taken:job")
	}
	h.Publish(Event{Kind: Taken, ID: "other"})
	if woken(reread) || woken(news) {
		t.Error("taken:other woke a waiter for taken:job")
	}
	h.Publish(Event{Kind: Taken, ID: "job"})
	if !woken(reread) || !woken(news) {
		t.Error("taken:job did not wake both waiters")
	}

	for _, payload := range []string{"dead:here", DeadHere + ":x", "dead:here:"} {
		if ev, ok := Parse(payload); ok && ev.Kind == DeadHere {
			t.Errorf("payload %q parsed as the watcher's own %q", payload, DeadHere)
		}
	}
}

// A waiter by ids (a shard set member, which tries the very shards notified free) gets the
// ids of the events it matched since it last took them, each once, and no resync; at most
// maxPendingIDs of them, past which take says that some were left out, so that a flood
// costs no more memory than that and the waiter acts on every id it waits for.
func TestSubscribeIDsGathersTheIDsUpToABound(t *testing.T) {
	var h Hub
	wake, take, unsubscribe := h.SubscribeIDs(func(ev Event) bool { return ev.Kind == Free })
	defer unsubscribe()
	for _, ev := range []Event{{Kind: Free, ID: "s/1"}, {Kind: Taken, ID: "s/2"}, {Kind: Free, ID: "s/3"}, {Kind: Free, ID: "s/1"}, {Kind: Resync}} {
		h.Publish(ev)
	}
	select {
	case <-wake:
	default:
		t.Fatal("free:s/1 did not wake the waiter")
	}
	ids, all := take()
	if len(ids) != 2 || all || !(ids[0] == "s/1" && ids[1] == "s/3" || ids[0] == "s/3" && ids[1] == "s/1") {
		t.Errorf("take = %v, %v; want s/1 and s/3, none left out", ids, all)
	}
	for i := range maxPendingIDs + 10 {
		h.Publish(Event{Kind: Free, ID: "s/" + string(rune('a'+i%26)) + string(rune(i))})
	}
	if ids, all := take(); len(ids) != maxPendingIDs || !all {
		t.Errorf("after a flood, take gave %d ids, left out %v; want %d and true", len(ids), all, maxPendingIDs)
	}
	if ids, all := take(); len(ids) != 0 || all {
		t.Errorf("a second take = %d ids, %v; want none", len(ids), all)
	}
	var nilHub *Hub
	if _, take, _ := nilHub.SubscribeIDs(func(Event) bool { return true }); take != nil {
		if ids, all := take(); ids != nil || all {
			t.Errorf("take of a nil *Hub = %v, %v", ids, all)
		}
	}
}
