package liveness

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// events hands the notifications the alive lock's session receives to the waiters of
// this process (elector followers, the reaper's follower, WatchAlive). A waiter is woken,
// not told what happened: each wake-up channel holds at most one pending wake-up, so a
// burst of notifications wakes it once and none is ever lost, and the waiter reads the
// state it waits for from the database. Correctness never depends on it: every waiter
// polls too. The zero value and a nil *events are usable; a nil one never wakes anyone.
type events struct {
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

// subscribeMembers is subscribe for membership events: while any such subscription
// exists, the listening session also listens to the members channel (PostgreSQL signals
// every listener of a channel for each notification, so the fleet's agents do not all
// listen to every join).
func (h *events) subscribeMembers(match func(notify.Event) bool) (<-chan struct{}, func()) {
	if h == nil {
		return nil, func() {}
	}
	wake, unsubscribe := h.subscribe(match)
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
func (h *events) MembersWanted() bool { return h != nil && h.members.Load() > 0 }

func (h *events) membersWantChanged() {
	h.mu.Lock()
	f := h.membersChanged
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

// onMembersWantChanged sets what is called when MembersWanted changes.
func (h *events) onMembersWantChanged(f func()) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.membersChanged = f
	h.mu.Unlock()
}

// Listening reports whether a session listens on the events channel now (false on a nil
// *events).
func (h *events) Listening() bool { return h != nil && h.listening.Load() }

// setListening records whether the listening session is up. Going down wakes every
// waiter, so that each goes back to polling at its short period at once.
func (h *events) setListening(on bool) {
	if h == nil || h.listening.Swap(on) == on || on {
		return // listen publishes its own resync once the LISTEN took effect
	}
	h.publish(notify.Event{Kind: notify.Resync})
}

type eventSub struct {
	match  func(notify.Event) bool
	resync bool // woken by notify.Resync too
	wake   chan struct{}
	// ids gathers the ids of the events matched since the last take (subscribeIDs); at
	// most maxPendingIDs, past which overflow says that some were left out.
	ids      map[string]struct{}
	overflow bool
}

// maxPendingIDs bounds what a subscription of subscribeIDs gathers between two takes:
// a flood of payloads costs it no more memory than that.
const maxPendingIDs = 4096

// subscribe returns a channel that receives a wake-up after each event match accepts
// (and after every notify.Resync), and the function that ends the subscription.
func (h *events) subscribe(match func(notify.Event) bool) (<-chan struct{}, func()) {
	return h.add(match, true)
}

// subscribeNews is subscribe for a waiter whose wake-up means that the event happened
// (a lease was taken: stop trying), not that it may have: a resync does not wake it.
// A listening session that drops and comes back again and again publishes a resync each
// time; a follower that took each one for taken:<lease> gave up every try it was about
// to make, and never took a lease that was free.
func (h *events) subscribeNews(match func(notify.Event) bool) (<-chan struct{}, func()) {
	return h.add(match, false)
}

// subscribeIDs is subscribeNews for a waiter that acts on the ids the events name (a
// shard set's member tries the very shards whose leases were freed, not all it waits
// for): take returns the ids gathered since the last take, and all is true when some
// were left out (more than maxPendingIDs came meanwhile), so that the waiter acts as if
// every id it waits for had come. take on a nil *events returns nothing.
func (h *events) subscribeIDs(match func(notify.Event) bool) (wake <-chan struct{}, take func() (ids []string, all bool), unsubscribe func()) {
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

func (h *events) add(match func(notify.Event) bool, resync bool) (<-chan struct{}, func()) {
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
func (h *events) addSub(s *eventSub) *eventSub {
	s.wake = make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[*eventSub]struct{}{}
	}
	h.subs[s] = struct{}{}
	return s
}

// publish wakes every subscriber the event concerns. It never blocks.
func (h *events) publish(e notify.Event) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if e.Kind == notify.Resync && s.resync || e.Kind != notify.Resync && s.match(e) {
			if s.ids != nil && e.Kind != notify.Resync {
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

// wakeLimiter bounds the work notifications cause, whatever their rate: a token bucket
// of wakeBurst tokens that refills at one per wakeHoldoff. A burst of legitimate changes
// (a member dies, its leases are freed, a new one joins) is acted on at once; a flood
// costs one action per wakeHoldoff. Owned by one goroutine.
type wakeLimiter struct {
	tokens float64
	last   time.Time
}

// wakeBurst is how many wake-ups are acted on at once before the limiter holds off.
const wakeBurst = 4

// delay takes a token and returns how long to wait before acting: zero while the
// bucket has one, else until it refills.
func (l *wakeLimiter) delay(now time.Time) time.Duration {
	if l.last.IsZero() {
		l.tokens, l.last = wakeBurst, now
	}
	l.tokens = min(wakeBurst, l.tokens+float64(now.Sub(l.last))/float64(wakeHoldoff))
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return 0
	}
	wait := time.Duration((1 - l.tokens) * float64(wakeHoldoff))
	l.tokens = 0
	l.last = now.Add(wait)
	return wait
}
