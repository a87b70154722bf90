package notify

import (
	"sync"
	"sync/atomic"
)

// Hub hands the notifications the alive lock's session receives to the waiters of
// this process (elector followers, the reaper's follower, WatchAlive). A waiter is woken,
// not told what happened: each wake-up channel holds at most one pending wake-up, so a
// burst of notifications wakes it once and none is ever lost, and the waiter reads the
// state it waits for from the database. Correctness never depends on it: every waiter
// polls too. The zero value and a nil *Hub are usable; a nil one never wakes anyone.
type Hub struct {
	mu   sync.Mutex
	subs map[*eventSub]struct{}
	// listening is whether a session LISTENs on the channel now: while it does, waiters
	// may poll rarely, because what they wait for is notified.
	listening atomic.Bool
	// members counts the subscriptions to membership (joined, left, dead), which arrive
	// on a channel of their own that the session listens to only while one exists;
	// membersChanged (the session's wake) is called when that count leaves or reaches 0.
	members        atomic.Int32
	membersChanged func()
}

// SubscribeMembers is Subscribe for membership events: while any such subscription
// exists, the listening session also listens to the members channel (PostgreSQL signals
// every listener of a channel for each notification, so the fleet's agents do not all
// listen to every join).
func (h *Hub) SubscribeMembers(match func(Event) bool) (<-chan struct{}, func()) {
	if h == nil {
		return nil, func() {}
	}
	wake, unsubscribe := h.Subscribe(match)
	if h.members.Add(1) == 1 {
		h.membersWantChanged()
	}
	var once sync.Once
	return wake, func() {
		once.Do(func() {
			unsubscribe()
			if h.members.Add(-1) == 0 {
				h.membersWantChanged()
			}
		})
	}
}

// MembersWanted reports whether something waits for membership events.
func (h *Hub) MembersWanted() bool { return h != nil && h.members.Load() > 0 }

func (h *Hub) membersWantChanged() {
	h.mu.Lock()
	f := h.membersChanged
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

// OnMembersWantChanged sets what is called when MembersWanted changes.
func (h *Hub) OnMembersWantChanged(f func()) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.membersChanged = f
	h.mu.Unlock()
}

// Listening reports whether a session listens on the events channel now (false on a nil
// *Hub).
func (h *Hub) Listening() bool { return h != nil && h.listening.Load() }

// SetListening records whether the listening session is up. Going down wakes every
// waiter, so that each goes back to polling at its short period at once.
func (h *Hub) SetListening(on bool) {
	if h == nil || h.listening.Swap(on) == on || on {
		return // the session publishes its own resync once the LISTEN took effect
	}
	h.Publish(Event{Kind: Resync})
}

type eventSub struct {
	match  func(Event) bool
	resync bool // woken by Resync too
	wake   chan struct{}
	// ids gathers the ids of the events matched since the last take (SubscribeIDs); at
	// most maxPendingIDs, past which overflow says that some were left out.
	ids      map[string]struct{}
	overflow bool
}

// maxPendingIDs bounds what a subscription of SubscribeIDs gathers between two takes:
// a flood of payloads costs it no more memory than that.
const maxPendingIDs = 4096

// Subscribe returns a channel that receives a wake-up after each event match accepts
// (and after every Resync), and the function that ends the subscription.
func (h *Hub) Subscribe(match func(Event) bool) (<-chan struct{}, func()) {
	return h.add(match, true)
}

// SubscribeNews is Subscribe for a waiter whose wake-up means that the event happened
// (a lease was taken: stop trying), not that it may have: a resync does not wake it.
// A listening session that drops and comes back again and again publishes a resync each
// time; a follower that took each one for taken:<lease> gave up every try it was about
// to make, and never took a lease that was free.
func (h *Hub) SubscribeNews(match func(Event) bool) (<-chan struct{}, func()) {
	return h.add(match, false)
}

// SubscribeIDs is SubscribeNews for a waiter that acts on the ids the events name (a
// shard set's member tries the very shards whose leases were freed, not all it waits
// for): take returns the ids gathered since the last take, and all is true when some
// were left out (more than maxPendingIDs came meanwhile), so that the waiter acts as if
// every id it waits for had come. take on a nil *Hub returns nothing.
func (h *Hub) SubscribeIDs(match func(Event) bool) (wake <-chan struct{}, take func() (ids []string, all bool), unsubscribe func()) {
	if h == nil {
		return nil, func() ([]string, bool) { return nil, false }, func() {}
	}
	s := h.addSub(&eventSub{match: match, ids: map[string]struct{}{}})
	return s.wake, func() ([]string, bool) {
			h.mu.Lock()
			defer h.mu.Unlock()
			ids := make([]string, 0, len(s.ids))
			for id := range s.ids {
				ids = append(ids, id)
			}
			all := s.overflow
			clear(s.ids)
			s.overflow = false
			return ids, all
		}, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.subs, s)
		}
}

func (h *Hub) add(match func(Event) bool, resync bool) (<-chan struct{}, func()) {
	if h == nil {
		return nil, func() {}
	}
	s := h.addSub(&eventSub{match: match, resync: resync})
	return s.wake, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, s)
	}
}

// addSub registers s, all of whose fields but wake are set.
func (h *Hub) addSub(s *eventSub) *eventSub {
	s.wake = make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[*eventSub]struct{}{}
	}
	h.subs[s] = struct{}{}
	return s
}

// Publish wakes every subscriber the event concerns. It never blocks.
func (h *Hub) Publish(e Event) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if e.Kind == Resync && s.resync || e.Kind != Resync && s.match(e) {
			if s.ids != nil && e.Kind != Resync {
				if _, ok := s.ids[e.ID]; !ok && len(s.ids) >= maxPendingIDs {
					s.overflow = true
				} else {
					s.ids[e.ID] = struct{}{}
				}
			}
			select {
			case s.wake <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
	}
}
