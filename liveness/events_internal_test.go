package liveness

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// A resync (the listening session dropped or came back) wakes the waiters that re-read
// on it, not those whose wake-up means that a thing happened: a follower that took each
// resync for taken:<lease> gave up the try it was about to make. And the watcher's
// dead:here can never come from a payload.
func TestResyncWakesOnlyTheWaitersThatReadAgain(t *testing.T) {
	var h events
	isTaken := func(ev notify.Event) bool { return ev.Kind == notify.Taken && ev.ID == "job" }
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

	h.publish(notify.Event{Kind: notify.Resync})
	if !woken(reread) {
		t.Error("a resync did not wake a subscribe waiter")
	}
	if woken(news) {
		t.Error("a resync woke a subscribeNews waiter: it would take it for taken:job")
	}
	h.publish(notify.Event{Kind: notify.Taken, ID: "other"})
	if woken(reread) || woken(news) {
		t.Error("taken:other woke a waiter for taken:job")
	}
	h.publish(notify.Event{Kind: notify.Taken, ID: "job"})
	if !woken(reread) || !woken(news) {
		t.Error("taken:job did not wake both waiters")
	}

	for _, payload := range []string{"dead:here", notify.DeadHere + ":x", "dead:here:"} {
		if ev, ok := notify.Parse(payload); ok && ev.Kind == notify.DeadHere {
			t.Errorf("payload %q parsed as the watcher's own %q", payload, notify.DeadHere)
		}
	}
}

// A waiter by ids (a shard set member, which tries the very shards notified free) gets the
// ids of the events it matched since it last took them, each once, and no resync; at most
// maxPendingIDs of them, past which take says that some were left out, so that a flood
// costs no more memory than that and the waiter acts on every id it waits for.
func TestSubscribeIDsGathersTheIDsUpToABound(t *testing.T) {
	var h events
	wake, take, unsubscribe := h.subscribeIDs(func(ev notify.Event) bool { return ev.Kind == notify.Free })
	defer unsubscribe()
	for _, ev := range []notify.Event{{Kind: notify.Free, ID: "s/1"}, {Kind: notify.Taken, ID: "s/2"}, {Kind: notify.Free, ID: "s/3"}, {Kind: notify.Free, ID: "s/1"}, {Kind: notify.Resync}} {
		h.publish(ev)
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
		h.publish(notify.Event{Kind: notify.Free, ID: "s/" + string(rune('a'+i%26)) + string(rune(i))})
	}
	if ids, all := take(); len(ids) != maxPendingIDs || !all {
		t.Errorf("after a flood, take gave %d ids, left out %v; want %d and true", len(ids), all, maxPendingIDs)
	}
	if ids, all := take(); len(ids) != 0 || all {
		t.Errorf("a second take = %d ids, %v; want none", len(ids), all)
	}
	var nilEvents *events
	if _, take, _ := nilEvents.subscribeIDs(func(notify.Event) bool { return true }); take != nil {
		if ids, all := take(); ids != nil || all {
			t.Errorf("take of a nil *events = %v, %v", ids, all)
		}
	}
}
