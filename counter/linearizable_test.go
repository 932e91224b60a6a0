package counter_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/counter"
	"github.com/qbroker/qbroker/internal/zktest"
)

// opIn is an operation of the history: an Add of delta, a
// CompareAndSet of old to new, or a Get.
type opIn struct {
	kind     string // "add", "cas", "get"
	delta    int64
	old, new int64
}

// opOut is its answer: the value (Add, Get) or swapped (CompareAndSet).
type opOut struct {
	value   int64
	swapped bool
}

// counterModel is the sequential specification of a counter.
var counterModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(int64), input.(opIn), output.(opOut)
		switch in.kind {
		case "add":
			return out.value == s+in.delta, s + in.delta
		case "cas":
			if s == in.old {
				return out.swapped, in.new
			}
			return !out.swapped, s
		default:
			return out.value == s, s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(opIn), output.(opOut)
		switch in.kind {
		case "add":
			return fmt.Sprintf("add(%d) -> %d", in.delta, out.value)
		case "cas":
			return fmt.Sprintf("cas(%d, %d) -> %v", in.old, in.new, out.swapped)
		default:
			return fmt.Sprintf("get() -> %d", out.value)
		}
	},
}

// The model is not vacuous: it refuses a Get that saw an Add's value
// before the Add was called, and a CompareAndSet that failed on the
// value it expected while nothing ran beside it.
func TestCounterModelRefusesIllegalHistories(t *testing.T) {
	illegal := [][]porcupine.Operation{
		{
			{ClientId: 0, Input: opIn{kind: "get"}, Output: opOut{value: 1}, Call: 0, Return: 10},
			{ClientId: 1, Input: opIn{kind: "add", delta: 1}, Output: opOut{value: 1}, Call: 20, Return: 30},
		},
		{
			{ClientId: 0, Input: opIn{kind: "add", delta: 3}, Output: opOut{value: 3}, Call: 0, Return: 10},
			{ClientId: 1, Input: opIn{kind: "cas", old: 3, new: 4}, Output: opOut{swapped: false}, Call: 20, Return: 30},
		},
	}
	for i, h := range illegal {
		if r := porcupine.CheckOperationsTimeout(counterModel, h, 10*time.Second); r != porcupine.Illegal {
			t.Errorf("history %d: got %v, want Illegal", i, r)
		}
	}
}

// Eight clients over two sessions run Adds, CompareAndSets (mostly of
// a value just seen, so that they contend) and Gets, with rollovers
// every few writes; the history of calls and answers, with their call
// and return times, is linearizable.
func TestHistoryIsLinearizable(t *testing.T) {
	defer counter.SetMaxVersion(7)()
	const clients, ops = 8, 60
	p := zktest.Root(t) + "/lin"
	conns := []*zk.Conn{zktest.Conn(t), zktest.Conn(t)}
	ctx := testCtx(t, 2*time.Minute)
	// Two Counters per session: Adds through one Counter are combined,
	// the others are not.
	var counters []*counter.Counter
	for i := range 4 {
		counters = append(counters, newCounter(t, conns[i%2], p))
	}
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var history []porcupine.Operation
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for id := range clients {
		c := counters[id%len(counters)]
		rng := rand.New(rand.NewPCG(uint64(id), 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seen int64
			for range ops {
				var in opIn
				switch r := rng.IntN(10); {
				case r < 4:
					in = opIn{kind: "add", delta: int64(rng.IntN(3)) - 1}
				case r < 8:
					in = opIn{kind: "cas", old: seen + int64(rng.IntN(3)) - 1, new: seen + int64(rng.IntN(5))}
				default:
					in = opIn{kind: "get"}
				}
				call := now()
				var out opOut
				var err error
				switch in.kind {
				case "add":
					out.value, err = c.Add(ctx, in.delta)
					seen = out.value
				case "cas":
					out.swapped, err = c.CompareAndSet(ctx, in.old, in.new)
					if out.swapped {
						seen = in.new
					}
				default:
					out.value, err = c.Get(ctx)
					seen = out.value
				}
				ret := now()
				if err != nil {
					errs <- fmt.Errorf("client %d: %s: %w", id, in.kind, err)
					return
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	swaps := 0
	for _, op := range history {
		if op.Input.(opIn).kind == "cas" && op.Output.(opOut).swapped {
			swaps++
		}
	}
	res := porcupine.CheckOperationsTimeout(counterModel, history, time.Minute)
	t.Logf("%d operations (%d successful CompareAndSets): %v", len(history), swaps, res)
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations: %v, want Ok", len(history), res)
	}
}
