package lock_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
)

// handoffContenders is the number of sessions contending in the handoff
// benchmarks.
const handoffContenders = 16

// One session locks and unlocks, nobody else contending: ns/op is the
// latency of Lock+Unlock.
func BenchmarkMutexUncontended(b *testing.B) {
	m := newMutex(b, zktest.Conn(b), zktest.Root(b)+"/lock")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		g, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// Sixteen sessions lock and unlock b.N times in total: handoffs/s is how
// often the lock changes hands.
func BenchmarkMutexHandoff(b *testing.B) {
	root := zktest.Root(b) + "/lock"
	mutexes := make([]*lock.Mutex, handoffContenders)
	for i := range mutexes {
		mutexes[i] = newMutex(b, zktest.Conn(b), root)
	}
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errc := make(chan error, len(mutexes))
	b.ResetTimer()
	start := time.Now()
	for _, m := range mutexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				g, err := m.Lock(ctx)
				if err == nil {
					err = g.Unlock(ctx)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	for err := range errc {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "handoffs/s")
}

// The same two measurements of kazoo's Lock recipe (python3-kazoo),
// against the same ZooKeeper server, by bench/kazoo_lock.py. Skipped when
// kazoo is not installed.
func BenchmarkKazoo(b *testing.B) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import kazoo").Run(); err != nil {
		b.Skipf("python3-kazoo not installed: %v", err)
	}
	for _, mode := range []string{"uncontended", "handoff"} {
		b.Run(mode, func(b *testing.B) {
			args := []string{filepath.Join("bench", "kazoo_lock.py"), zktest.Addr(b), mode, strconv.Itoa(b.N), strconv.Itoa(handoffContenders)}
			out, err := exec.Command(python, args...).CombinedOutput()
			if err != nil {
				b.Fatalf("%v: %s", err, out)
			}
			secs, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "seconds=")
			s, err := strconv.ParseFloat(secs, 64)
			if !ok || err != nil {
				b.Fatalf("unexpected output: %s", out)
			}
			b.ReportMetric(s*1e9/float64(b.N), "ns/op")
			if mode == "handoff" {
				b.ReportMetric(float64(b.N)/s, "handoffs/s")
			}
		})
	}
}
