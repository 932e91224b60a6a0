package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Benchmarks run against the package's real ZooKeeper server:
//
//	go test -run '^$' -bench . -benchmem ./zkqueue

var payload100 = make([]byte, 100)

func BenchmarkPublish(b *testing.B) {
	q, err := zkqueue.New(zktest.Conn(b), zktest.Root(b)+"/q")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(payload100)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := q.Publish(ctx, payload100); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishParallel publishes from many goroutines sharing one
// session, as a broker does.
func BenchmarkPublishParallel(b *testing.B) {
	q, err := zkqueue.New(zktest.Conn(b), zktest.Root(b)+"/q")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := q.Publish(ctx, payload100); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkPublishBatch100(b *testing.B) {
	q, err := zkqueue.New(zktest.Conn(b), zktest.Root(b)+"/q")
	if err != nil {
		b.Fatal(err)
	}
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = payload100
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := q.PublishBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkDequeue claims (getData + delete) messages another session
// published, one consumer.
func BenchmarkDequeue(b *testing.B) {
	benchDequeue(b, 1, false)
}

// BenchmarkDequeueParallel claims with 16 goroutines sharing one Queue:
// they share one snapshot and never collide.
func BenchmarkDequeueParallel(b *testing.B) {
	benchDequeue(b, 16, false)
}

// BenchmarkDequeueOwn claims messages the same Queue published: their data
// is still known, so a claim is a delete without the read.
func BenchmarkDequeueOwn(b *testing.B) {
	benchDequeue(b, 1, true)
}

func benchDequeue(b *testing.B, par int, own bool) {
	path := zktest.Root(b) + "/q"
	q, err := zkqueue.New(zktest.Conn(b), path)
	if err != nil {
		b.Fatal(err)
	}
	pub := q
	if own {
		// A Queue remembers what it publishes while it consumes.
		if _, err := q.TryDequeue(context.Background()); !errors.Is(err, zkqueue.ErrEmpty) {
			b.Fatal(err)
		}
	} else {
		if pub, err = zkqueue.New(zktest.Conn(b), path); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	batch := make([][]byte, 500)
	for i := range batch {
		batch[i] = payload100
	}
	for n := 0; n < b.N; n += len(batch) {
		if _, err := pub.PublishBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetParallelism(par)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := q.TryDequeue(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPublishPath compares the latency of one message per publish
// call with that of the bare create it ends in, from 4 goroutines: a
// sequential create each on a session of its own (the load tester's
// "create" baseline), and Queue.Publish through a Committer (a Multi of
// the tail segment's version check and the create) over 2 writer
// sessions, as a broker publishes, and over 4. It reports the median and
// p99 call in µs:
//
//	go test -run '^$' -bench PublishPath -benchtime 20000x ./zkqueue
func BenchmarkPublishPath(b *testing.B) {
	ctx := context.Background()
	root := zktest.Root(b)
	conns := make([]*zk.Conn, 4)
	for i := range conns {
		conns[i] = zktest.Conn(b)
	}
	if err := zkutil.EnsurePath(conns[0], root+"/bare", zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	publish := func(writers int) func(int) error {
		c := zkqueue.NewCommitter(conns[:writers], zkqueue.CommitterConfig{})
		b.Cleanup(c.Close)
		q, err := zkqueue.New(conns[0], fmt.Sprintf("%s/q%d", root, writers), zkqueue.WithCommitter(c))
		if err != nil {
			b.Fatal(err)
		}
		return func(int) error {
			_, err := q.Publish(ctx, payload100)
			return err
		}
	}
	for _, bc := range []struct {
		name string
		call func(g int) error
	}{
		{"create", func(g int) error {
			_, err := conns[g].Create(root+"/bare/qn-", payload100, zk.FlagSequence, zk.WorldACL(zk.PermAll))
			return err
		}},
		{"publish-2-writers", publish(2)},
		{"publish-4-writers", publish(4)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lat := make([][]time.Duration, len(conns))
			var wg sync.WaitGroup
			work := make(chan struct{}, b.N)
			for range b.N {
				work <- struct{}{}
			}
			close(work)
			b.ResetTimer()
			for g := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range work {
						t0 := time.Now()
						if err := bc.call(g); err != nil {
							b.Error(err)
							return
						}
						lat[g] = append(lat[g], time.Since(t0))
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		})
	}
}
