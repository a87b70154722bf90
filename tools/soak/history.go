package soak

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// Event kinds in a history.
const (
	EvFault     = "fault"      // a fault applied: Fault, FaultID, Targets
	EvHeal      = "heal"       // a fault healed: Fault, FaultID, Targets
	EvStart     = "start"      // a fleet process is ready with instance Inst (Lease: the lease it competes for; Set: the shard set it takes part in, of Shards shards; Node: the node agent's process it is attached to)
	EvExit      = "exit"       // a fleet process exited on its own (Note: how)
	EvJobBegin  = "job_begin"  // Inst entered the job of Lease under Epoch
	EvJobEnd    = "job_end"    // its job returned
	EvLost      = "lost"       // Inst was told it lost Lease (Epoch)
	EvRejected  = "rejected"   // a fenced write of Inst was refused
	EvLedger    = "ledger"     // a ledger row accepted: ID, Lease, Epoch, Inst (writer), T (the server's clock at its COMMIT), From (when its transaction began, now(); 0 when not recorded)
	EvDBHistory = "db_history" // a row of the schema's history of a lease (migration 0020): Lease, Epoch, Inst (the holder), Note (acquired, ended), Name (how), T (at), Prev (since: an acquisition's gap began, 0 for none)
	EvLeaseRow  = "lease_row"  // a change of a lease's row, as the database recorded it: Lease, Epoch, Taken, Exp (taken_at, expires_at), Note (insert, update, delete), T (the server's clock)
	EvVerdict   = "verdict"    // a change of a verdict on Inst (Proc for the exporter) from Source: Alive, Note (the state); the sample sent at From and answered at T; PrevFrom and Prev, the last sample before
	EvGap       = "gap"        // Source's samples were more than GapLimit apart: none answered between Prev and T
	EvHolder    = "holder"     // a change of Lease's holder in the leases table: Inst ("" none), Epoch
	EvAlert     = "alert"      // a change of an alert's state in Prometheus: Name, State ("" inactive)
	EvResource  = "resource"   // a sample of the observer exporter: Source (goroutines, fds, rss, conns), Value
	EvRunEnd    = "run_end"    // the run ended
	EvInterrupt = "interrupt"  // the run was interrupted (SIGINT)
)

// Event kinds of a shard set's members. A shard's lease is named "<set>/<shard>"; Inst,
// Lease and Epoch say whose callback, Note the cause.
const (
	EvShardOwned    = "shard_owned"    // Inst came to own the shard: its callback began
	EvShardStop     = "shard_stop"     // the callback's context ended, the shard's lease still held (a move, the member lease lost, a shutdown)
	EvShardLost     = "shard_lost"     // the callback's context ended because the shard's lease was lost: Inst was told
	EvShardRefused  = "shard_refused"  // a write under the shard's fence was refused (Note: "lost", or "late": past its deadline, the lease held)
	EvShardReleased = "shard_released" // the callback returned
)

// Verdict sources.
const (
	SrcSQL      = "is_instance_alive" // is_instance_alive(id, stale threshold)
	SrcExporter = "exporter"          // the observer's pg_liveness_instances, by service
	SrcLock     = "lock"              // the instance's alive lock granted in pg_locks
	SrcReader   = "reader"            // liveness.Reader.Instances, as a service reads its peers
)

// Targets of a fault that affects every process (the database's faults).
const AllProcs = "*"

// Event is one line of a history. T is wall-clock Unix nanoseconds: every process of the
// soak runs on one host, and the ledger's and the lease rows' times come from the server's
// clock_timestamp(), the same clock.
type Event struct {
	T       int64    `json:"t"`
	Kind    string   `json:"kind"`
	Proc    string   `json:"proc,omitempty"`
	Inst    string   `json:"inst,omitempty"`
	Lease   string   `json:"lease,omitempty"`
	Epoch   int64    `json:"epoch,omitempty"`
	ID      int64    `json:"id,omitempty"`
	Fault   string   `json:"fault,omitempty"`
	FaultID int      `json:"fault_id,omitempty"`
	Targets []string `json:"targets,omitempty"`
	Source  string   `json:"src,omitempty"`
	Alive   bool     `json:"alive,omitempty"`
	Prev    int64    `json:"prev,omitempty"`
	Name    string   `json:"name,omitempty"`
	State   string   `json:"state,omitempty"`
	Value   float64  `json:"v,omitempty"`
	Note    string   `json:"note,omitempty"`
	Set     string   `json:"set,omitempty"`
	Shards  int      `json:"shards,omitempty"`
	Node    string   `json:"node,omitempty"`
	// A verdict's samples: this one was sent at From, the last one of the value before at
	// PrevFrom (and answered at Prev).
	From     int64 `json:"from,omitempty"`
	PrevFrom int64 `json:"prev_from,omitempty"`
	// A lease row's taken_at and expires_at, Unix nanoseconds on the server's clock.
	Taken int64 `json:"taken,omitempty"`
	Exp   int64 `json:"exp,omitempty"`
}

// At is the event's time.
func (e Event) At() time.Time { return time.Unix(0, e.T) }

// MaxHistoryBytes bounds the history file: past it, events are kept in memory for the
// checker but no longer written, and the file says so in its last line. Verdicts,
// holders and alerts are recorded as changes, not samples, so a two-hour run stays far
// below it.
const MaxHistoryBytes = 256 << 20

// History is the run's record: in memory for the checker, and as JSON lines on disk.
// Beside it, the fleet processes' own log lines (ProcessLogPath): a violation's cause is
// often in what the process said at the time, and a process that ran on to the end keeps
// only its last lines in the test's output.
type History struct {
	mu        sync.Mutex
	events    []Event
	w         *bufio.Writer
	f         *os.File
	written   int64
	truncated bool

	logW         *bufio.Writer
	logF         *os.File
	logWritten   int64
	logTruncated bool
}

// ProcessLogPath is where the history at path keeps the processes' log lines.
func ProcessLogPath(path string) string { return strings.TrimSuffix(path, ".jsonl") + ".log" }

// NewHistory records into path (created, or truncated), and the processes' log lines
// into ProcessLogPath(path); "" keeps the history in memory and the log lines nowhere.
func NewHistory(path string) (*History, error) {
	h := &History{}
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		lf, err := os.Create(ProcessLogPath(path))
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		h.f, h.w = f, bufio.NewWriter(f)
		h.logF, h.logW = lf, bufio.NewWriter(lf)
	}
	return h, nil
}

// Log records a line a fleet process printed, with the time it was read and the
// process's name, up to MaxHistoryBytes (then the file says so in its last line).
func (h *History) Log(proc, line string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.logW == nil || h.logTruncated {
		return
	}
	entry := time.Now().UTC().Format("15:04:05.000000") + " " + proc + " " + line + "\n"
	if h.logWritten+int64(len(entry)) > MaxHistoryBytes {
		h.logTruncated = true
		fmt.Fprintf(h.logW, "the processes' log reached %d bytes; later lines were not written\n", MaxHistoryBytes)
		return
	}
	h.logWritten += int64(len(entry))
	_, _ = h.logW.WriteString(entry)
}

// Add records e, stamping it with the time now when it has none.
func (h *History) Add(e Event) {
	if e.T == 0 {
		e.T = time.Now().UnixNano()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
	if h.w == nil || h.truncated {
		return
	}
	line, _ := json.Marshal(e)
	if h.written+int64(len(line))+1 > MaxHistoryBytes {
		h.truncated = true
		fmt.Fprintf(h.w, `{"kind":"truncated","note":"history file reached %d bytes; later events were checked but not written"}`+"\n", MaxHistoryBytes)
		return
	}
	h.written += int64(len(line)) + 1
	_, _ = h.w.Write(append(line, '\n'))
}

// Events returns the events so far in time order (stable for equal times).
func (h *History) Events() []Event {
	h.mu.Lock()
	out := append([]Event(nil), h.events...)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out
}

// Close flushes and closes the file.
func (h *History) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.f == nil {
		return nil
	}
	err := h.w.Flush()
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	if ferr := h.logW.Flush(); err == nil {
		err = ferr
	}
	if cerr := h.logF.Close(); err == nil {
		err = cerr
	}
	h.f, h.w, h.logF, h.logW = nil, nil, nil, nil
	return err
}

// ReadHistory reads a history file back, for checking a kept history again.
func ReadHistory(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for n := 1; sc.Scan(); n++ {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("history line %d: %w", n, err)
		}
		if e.Kind != "truncated" {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out, sc.Err()
}
