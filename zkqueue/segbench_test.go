package zkqueue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// BenchmarkSegmentSize drains a backlog of b.N messages of 100 bytes
// (published beforehand, not timed) with 16 consumers sharing one Queue
// and a Committer, FIFO and priority, for several segment sizes. It
// reports the claim rate and what one listing of a full segment costs
// (list-ms, list-KiB): a FIFO consumer lists a segment once per pass, a
// priority consumer at every change of its head. Run with a fixed count:
//
//	go test -run '^$' -bench SegmentSize -benchtime 40000x ./zkqueue
func BenchmarkSegmentSize(b *testing.B) {
	for _, prio := range []bool{false, true} {
		for _, size := range []int{1_000, 5_000, 20_000, 50_000} {
			b.Run(fmt.Sprintf("prio=%v/S=%d", prio, size), func(b *testing.B) { benchSegments(b, size, prio) })
		}
	}
}

func benchSegments(b *testing.B, size int, prio bool) {
	conn := zktest.Conn(b)
	c := zkqueue.NewCommitter([]*zk.Conn{conn}, zkqueue.CommitterConfig{})
	defer c.Close()
	opts := []zkqueue.Option{zkqueue.WithSegmentSize(size), zkqueue.WithCommitter(c)}
	if prio {
		opts = append(opts, zkqueue.WithPriorities())
	}
	root := zktest.Root(b)
	q, err := zkqueue.New(conn, root+"/q", opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	batch := make([][]byte, 1000)
	for i := range batch {
		batch[i] = payload100
	}
	for n := 0; n < b.N; n += len(batch) {
		if _, err := q.PublishBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	listMs, listBytes := listSegment(b, conn, root+"/q")
	b.SetParallelism(8) // 16 consumers on 2 cores
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := q.TryDequeue(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	b.ReportMetric(listMs, "list-ms")
	b.ReportMetric(listBytes/1024, "list-KiB")
}

// listSegment times a listing of the first segment under items and
// returns it with the bytes of the names listed.
func listSegment(b *testing.B, conn *zk.Conn, items string) (ms, bytes float64) {
	segs, _, err := conn.Children(items)
	if err != nil || len(segs) == 0 {
		b.Fatalf("segments: %v %v", segs, err)
	}
	first := segs[0]
	for _, s := range segs {
		first = min(first, s)
	}
	const rounds = 5
	start := time.Now()
	var names []string
	for range rounds {
		if names, _, err = conn.Children(items + "/" + first); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range names {
		bytes += float64(len(n) + 4)
	}
	return float64(time.Since(start).Microseconds()) / 1000 / rounds, bytes
}
