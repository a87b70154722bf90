package targets

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A turn held past its budget is taken back only while another waits: its scrape's
// context ends with the reason, and the turn goes to the one waiting. With nobody
// waiting, a turn past its budget runs on.
func TestTurnsTakeBackASlowTurnOnlyForOthersWaiting(t *testing.T) {
	tr := newTurns(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 30 s over 30 databases with one turn: a budget of minTurnBudget (1 s).
	slow, releaseSlow, err := tr.take(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseSlow()
	select {
	case <-slow.Done():
		t.Fatal("a turn taken back with nobody waiting")
	case <-time.After(minTurnBudget + 500*time.Millisecond):
	}
	type got struct {
		ctx     context.Context
		release func()
		err     error
	}
	next := make(chan got, 1)
	go func() {
		c, r, err := tr.take(ctx, 30)
		next <- got{c, r, err}
	}()
	select {
	case <-slow.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a turn past its budget kept while another waits")
	}
	if cause := context.Cause(slow); !errors.Is(slow.Err(), context.Canceled) || !strings.Contains(cause.Error(), "its turn was taken back") {
		t.Errorf("the slow turn's context ended with %v (cause %v)", slow.Err(), cause)
	}
	select {
	case g := <-next:
		t.Fatalf("the turn given before the slow one gave it back: %v", g.err)
	case <-time.After(100 * time.Millisecond):
	}
	releaseSlow()
	g := <-next
	if g.err != nil || g.ctx.Err() != nil {
		t.Fatalf("the waiting one: %v, %v", g.err, g.ctx.Err())
	}
	g.release()
	// Asked within a deadline that ends first: no turn, the deadline's error.
	busy, releaseBusy, _ := tr.take(ctx, 1)
	defer releaseBusy()
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, _, err := tr.take(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a turn asked within a deadline that ended: %v", err)
	}
	if busy.Err() != nil {
		t.Errorf("the turn held, within its budget, ended: %v", busy.Err())
	}
}
