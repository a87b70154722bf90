package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// watchReadTimeout bounds one read of the set.
const watchReadTimeout = 5 * time.Second

// WatchAlive calls fn with the alive instances of service (every service when it is
// empty), ordered by service and id, once at the start and then each time that set
// changes (an instance joins, leaves, or dies by the verdict), until ctx ends or the
// agent stops; it then returns nil. fn gets the full set each time, never a difference,
// so a missed change is repaired by the next call. It runs in WatchAlive's goroutine and
// must not block for long.
//
// The set is read (one Reader.Instances statement) when the agent's listening session is
// notified that an instance joined, left or died, when that session starts again (a
// notification may have been lost while it was away), and every 5 s whatever happens. A crashed instance leaves the set about its lock grace after its lock vanished
// (the watcher notifies it); one whose heartbeat went stale, at the next poll. In
// ModeHeartbeatTableOnly there is no listening session: the set is polled only.
//
// It is the Agent's, not the Reader's, because the wake-ups come from the agent's own
// listening session (the alive lock's connection); a Reader holds no connection.
//
// maxHeartbeatAge, when not zero, leaves out of the set the instances whose last
// heartbeat is older than it, alive by the verdict or not: a process that hangs (SIGSTOP,
// a long pause, a frozen VM) keeps its alive lock and stays alive by the verdict until the
// definitive-dead cutoff, but stops beating, and membership-based logic may want to move
// work away from it sooner. It must be above the slow heartbeat interval
// (Timing.HeartbeatSlowInterval, 60 s by default), at which a healthy instance that holds
// its lock beats, with a margin (90 s at the defaults): a healthy instance's heartbeat is
// that old just before each beat, and a bound below it would leave every such instance
// out of the set for part of each interval (at 15 s, most of every minute). WatchAlive
// refuses one that is not above this agent's HeartbeatSlowInterval with a *ConfigError
// naming maxHeartbeatAge; the watched service's instances must not beat slower either. A
// hung instance then leaves the set about maxHeartbeatAge after its last beat, so never
// within a lease's TTL at the defaults. Agent.Shards needs none of this: its leases move a
// hung owner's shards once they expire.
func (a *Agent) WatchAlive(ctx context.Context, service string, maxHeartbeatAge time.Duration, fn func(alive []InstanceStatus)) error {
	if fn == nil {
		return &ConfigError{Field: "WatchAlive fn", Reason: "must not be nil"}
	}
	switch slow := a.cfg.Timing.HeartbeatSlowInterval; {
	case maxHeartbeatAge < 0:
		return &ConfigError{Field: "WatchAlive maxHeartbeatAge", Reason: fmt.Sprintf("(%s) must not be negative", maxHeartbeatAge)}
	case maxHeartbeatAge > 0 && maxHeartbeatAge <= slow:
		// A healthy instance that holds its lock beats every slow interval: its heartbeat
		// is that old just before each beat, and it would be left out of the set then.
		return &ConfigError{Field: "WatchAlive maxHeartbeatAge", Reason: fmt.Sprintf("(%s) must be above the slow heartbeat "+
			"interval (AgentConfig.Timing.HeartbeatSlowInterval, %s), at which a healthy instance holding its lock "+
			"beats; give it a margin, such as %s", maxHeartbeatAge, slow, slow+slow/2)}
	}
	r, err := NewReader(ReaderConfig{DB: a.cfg.Pool, Schema: a.cfg.Schema})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(a.leading.stopping, cancel)
	defer stop()
	wake, unsubscribe := a.events.SubscribeMembers(func(ev notify.Event) bool {
		return ev.Kind == notify.Joined || ev.Kind == notify.Left || ev.Kind == notify.Dead
	})
	defer unsubscribe()
	poll := time.NewTicker(defaults.WatchAlivePoll)
	defer poll.Stop()
	var last []uuid.UUID
	first := true
	var failing logging.Repeats
	var limit wakeLimiter
	for {
		rctx, cancelRead := context.WithTimeout(ctx, watchReadTimeout)
		all, err := r.Instances(rctx, service)
		cancelRead()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// Told once: fn is not called until a read succeeds, so the caller's set is
			// as old as the last good read.
			failing.Log(a.cfg.Logger, slog.LevelWarn, "read",
				"watch: cannot read the instances; the alive set is reported again once a read succeeds",
				"service", service, "err", logging.RedactError(err))
		default:
			failing.Clear(a.cfg.Logger, "watch: reading the instances again", "service", service)
			alive := slices.DeleteFunc(all, func(s InstanceStatus) bool {
				return !s.State.Alive() || (maxHeartbeatAge > 0 && s.HeartbeatAge > maxHeartbeatAge)
			})
			ids := make([]uuid.UUID, len(alive))
			for i, s := range alive {
				ids[i] = s.InstanceID
			}
			if first || !slices.Equal(ids, last) {
				first, last = false, ids
				fn(alive)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			// Wake-ups are hints: a flood of them costs one read per wakeHoldoff;
			// those that come meanwhile are folded into the next read.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(limit.delay(time.Now())):
			}
		case <-poll.C:
		}
	}
}
