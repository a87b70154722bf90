// Package soak is the randomized fault soak (make soak): a running fleet of agents (the
// exporter binary as an agent, one of them also the node agent of some faultagents, and
// the faultagent, a service built on the liveness library, campaigning for four leases
// whose jobs append fenced rows to a ledger, and sharing a shard set whose owners append
// theirs), an observer exporter scraped by a real Prometheus with the shipped rules, all
// against a real PostgreSQL primary with a streaming replica. A nemesis applies and heals
// faults on a schedule drawn from a seed, overlapping them; every fault, job begin and
// end, shard ownership, ledger row, verdict change (the SQL verdict sampled every 20 ms),
// lease holder, alert and resource sample goes into a history, with the database's own
// record of every change of the leases' rows, and a checker looks for anomalies in it
// afterwards, in the manner of Jepsen's history checkers and etcd's functional tester.
//
// The checker excuses nothing it cannot prove harmless from the history: a process is
// live by evidence (a verdict sample after the last fault that disturbed it), an overlap
// of two job holders only when the database's record shows the earlier lease expired,
// and a case it cannot judge is counted as such, with why; the schedule keeps kills and
// stops apart from the faults that would make them unjudgeable, and the crash checks fail
// when fewer than MinJudged of the kills were judged.
//
// What it guarantees: the same seed, duration and fleet give the same schedule of faults
// (what the fleet does under them differs from run to run); the history on disk is
// bounded (MaxHistoryBytes) and kept, its path printed, when a check fails; servers and
// network namespaces are removed on exit and on SIGINT.
//
// The files other than the tests are the parts that need no database: the history, the
// schedule, the checker and the report. The fleet and the nemesis that drives it live in
// soak_test.go (TestSoak), since they use the test kit's servers.
//
// What it must never do: loosen a check to make a run pass. A violation is a bug in the
// library or the exporter, reported with the seed and the history.
package soak
