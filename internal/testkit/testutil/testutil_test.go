package testutil

import (
	"testing"
	"time"
)

func TestExposedMetrics(t *testing.T) {
	names := ExposedMetrics(t)
	for _, want := range []string{"pg_liveness_up", "pg_liveness_instances"} {
		if !names[want] {
			t.Errorf("%s is not in %s", want, ScenarioExposition)
		}
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if !Poll(time.Minute, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("Poll returned before the condition held, or went on after (n=%d)", n)
	}
	if Poll(50*time.Millisecond, func() bool { return false }) {
		t.Error("Poll reported a condition that never held")
	}
}
