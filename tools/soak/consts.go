package soak

import "time"

// SeedForTests is the seed of the two-minute run in make test.
const SeedForTests = 29

// SampleEvery is the cadence of the verdict sampler (SQL and the observer's /metrics).
const SampleEvery = 500 * time.Millisecond

// The checker's bounds. Each is the fault suite's documented bound for the same event
// (docs/failover.md, "Detection and takeover times", measured one fault at a time at the
// default settings), plus what the soak's own sampling adds; a soak that needs a looser
// bound than the suite documents has found a bug, not a reason to loosen it.
const (
	// CrashDeadBound: a process killed -9 is dead for every consumer within it. The
	// suite's scenario 1 bounds "dead for every consumer" at worst < 3 s; plus one sample.
	CrashDeadBound = 3*time.Second + SampleEvery

	// LeaseTakeBound: a lease whose holder was killed is held by another process within
	// it. Scenario 1 bounds "lease held by another process" at worst < 5 s. The jobs
	// record their own begin, so no sampling is added.
	LeaseTakeBound = 5 * time.Second

	// SettleAfterHeal: a process is "live and connected" only this long after the last
	// heal that affected it (and after it started). It is the suite's relock bound after a
	// restart or a failover, "every lock held again, from the server answering" < 11 s,
	// plus the half-open heal's worst relock (9.5 s measured) rounded up to leave a margin
	// of one reconnect backoff step.
	SettleAfterHeal = 15 * time.Second

	// ConvergenceBound: after the last heal, every live agent joined and holding its lock,
	// one holder per lease, within it: the relock bound (11 s) plus the faultagent's lease
	// ttl (10 s), within which a lease left by a holder that stepped down is free again,
	// plus the settling margin.
	ConvergenceBound = 30 * time.Second

	// ResumeEndBound: a holder that was stopped (SIGSTOP) past its lease's expiry may find
	// its successor already in the job when it resumes; it must leave the job within this
	// after SIGCONT. The suite measured "after SIGCONT: lease context cancelled" at 3 ms
	// worst (scenario 2); a second leaves room for a loaded machine.
	ResumeEndBound = time.Second

	// ShardsWrittenBound: after a heal that leaves no fault on a shard set's members or
	// the database, every shard of the set is written again within it. It is the fault
	// suite's bound for the worst of its shard scenarios, "PostgreSQL restart: every shard
	// written again" < 30 s (TestShards), which it counts from the restart's start and the
	// soak from the heal; it covers the relock (11 s) and a shard lease its owner could not
	// release (the database away) free again when it expires (the leases' ttl, 15 s), which
	// run together, plus the members' reading and a write's cadence.
	ShardsWrittenBound = 30 * time.Second
)
