package soak

import "time"

// SeedForTests is the seed of the two-minute run in make test.
const SeedForTests = 29

// The samplers' cadences. The SQL verdict (is_instance_alive, the alive lock, the
// leases) is read every SQLSampleEvery in one statement, so that a false-dead dip of a few
// tens of milliseconds is seen. liveness.Reader reads the same verdict through the Go
// API, and the observer exporter's /metrics runs every collector on each scrape: they are
// read less often, which finds what they alone could get wrong (their mapping of the
// verdict) without loading the two cores the fleet's timing depends on.
const (
	SQLSampleEvery      = 20 * time.Millisecond
	ReaderSampleEvery   = 100 * time.Millisecond
	ExporterSampleEvery = 250 * time.Millisecond
)

// GapFactor: a source's samples more than GapFactor periods apart leave a gap, recorded
// (EvGap); in a gap nothing is judged of that source.
const GapFactor = 5

// GapLimit is the longest a source's samples may be apart without leaving a gap.
func GapLimit(source string) time.Duration {
	switch source {
	case SrcReader:
		return GapFactor * ReaderSampleEvery
	case SrcExporter:
		return GapFactor * ExporterSampleEvery
	}
	return GapFactor * SQLSampleEvery
}

// MinJudged is the share of kills that the crash checks must judge: a schedule whose
// other faults make most crashes unjudgeable proves little about them.
const MinJudged = 0.9

// The checker's bounds. Each is the fault suite's documented bound for the same event
// (docs/failover.md, "Detection and takeover times", measured one fault at a time at the
// default settings); a soak that needs a looser bound than the suite documents has found
// a bug, not a reason to loosen it.
const (
	// CrashDeadBound: a process killed -9 is dead for every consumer within it: the
	// suite's scenario 1 bounds "dead for every consumer" at worst < 3 s. A crash is
	// judged by the SQL samples around it: called dead in time when a sample sent after
	// the kill answered dead within the bound, late when the last sample that still said
	// alive was sent past it, and not judged when the samples straddle the bound (a gap).
	CrashDeadBound = 3 * time.Second

	// LeaseTakeBound: a lease whose holder was killed is held by another process within
	// it. Scenario 1 bounds "lease held by another process" at worst < 5 s. The jobs
	// record their own begin, so no sampling is added.
	LeaseTakeBound = 5 * time.Second

	// ConvergenceBound: after the last heal, every live agent joined and holding its lock,
	// one holder per lease, within it: the suite's relock bound (11 s) plus the faultagent's
	// lease ttl (10 s), within which a lease left by a holder that stepped down is free
	// again, plus 9 s of margin.
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
