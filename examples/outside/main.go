// Command outside uses qbroker's recipes as a library, from a module of
// its own that requires the released github.com/go-zookeeper/zk: a FIFO
// queue drained by concurrent consumers, a lock passed between two
// sessions, a leader election with a handover and a counter added to
// from both sessions. It connects to the ZooKeeper servers named by
// $QBROKER_ZK (host:port[,host:port...]) and exits non-zero when a
// recipe misbehaves.
//
// It prints how the queue's consumer read the messages: one getData per
// message with the released client, a few multiRead requests with the
// patched client qbroker ships (third_party/go-zookeeper) put in its place
// by a replace in go.mod. The code is the same either way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/counter"
	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/zkqueue"
)

func main() {
	root := flag.String("root", "/qbroker-outside", "parent node of the recipes' nodes")
	messages := flag.Int("messages", 300, "messages to send through the queue")
	flag.Parse()
	servers := os.Getenv("QBROKER_ZK")
	if servers == "" {
		log.Fatal("set QBROKER_ZK to ZooKeeper servers (host:port[,host:port...])")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func() *zk.Conn {
		conn, _, err := zk.Connect(strings.Split(servers, ","), 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			log.Fatal(err)
		}
		return conn
	}
	// One session per role, as in separate processes.
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()

	if err := fifo(ctx, a, b, *root+"/queue", *messages); err != nil {
		log.Fatalf("fifo: %v", err)
	}
	if err := mutex(ctx, a, b, *root+"/lock"); err != nil {
		log.Fatalf("lock: %v", err)
	}
	if err := elect(ctx, a, b, *root+"/election"); err != nil {
		log.Fatalf("election: %v", err)
	}
	if err := count(ctx, a, b, *root+"/counter"); err != nil {
		log.Fatalf("counter: %v", err)
	}
	fmt.Println("ok")
}

// fifo publishes n messages on one session and drains them with eight
// consumers sharing a Queue on another: each is delivered once, in
// publish order at each consumer.
func fifo(ctx context.Context, pub, sub *zk.Conn, path string, n int) error {
	producer, err := zkqueue.New(pub, path)
	if err != nil {
		return err
	}
	for i := 0; i < n; i += 50 {
		batch := make([][]byte, 0, 50)
		for j := i; j < min(i+50, n); j++ {
			batch = append(batch, fmt.Appendf(nil, "%d", j))
		}
		if _, err := producer.PublishBatch(ctx, batch); err != nil {
			return err
		}
	}
	var gets, multiReads atomic.Int64
	consumer, err := zkqueue.New(sub, path, zkqueue.WithObserver(func(op string, _ time.Duration, err error) {
		switch {
		case op == "get" && err == nil:
			gets.Add(1)
		case op == "multiread" && err == nil:
			multiReads.Add(1)
		}
	}))
	if err != nil {
		return err
	}
	var mu sync.Mutex
	seen := make(map[string]int, n)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			last := -1
			for {
				m, err := consumer.TryDequeue(ctx)
				if errors.Is(err, zkqueue.ErrEmpty) {
					return
				}
				if err != nil {
					errc <- err
					return
				}
				var i int
				fmt.Sscan(string(m.Payload), &i)
				if i <= last {
					errc <- fmt.Errorf("message %d after %d", i, last)
				}
				last = i
				mu.Lock()
				seen[string(m.Payload)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	for i := range n {
		if c := seen[fmt.Sprint(i)]; c != 1 {
			return fmt.Errorf("message %d delivered %d times", i, c)
		}
	}
	fmt.Printf("fifo: %d messages delivered once each, read with %d getData and %d multiRead requests\n",
		n, gets.Load(), multiReads.Load())
	return nil
}

// mutex has two sessions take a lock in turn: the second cannot while
// the first holds it, and its grant carries a greater fencing token.
func mutex(ctx context.Context, a, b *zk.Conn, path string) error {
	ma, err := lock.NewMutex(a, path)
	if err != nil {
		return err
	}
	defer ma.Close()
	mb, err := lock.NewMutex(b, path)
	if err != nil {
		return err
	}
	defer mb.Close()
	ga, err := ma.Lock(ctx)
	if err != nil {
		return err
	}
	if _, err := mb.TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		return fmt.Errorf("TryLock while held: %v, want %v", err, lock.ErrLocked)
	}
	if err := ga.Unlock(ctx); err != nil {
		return err
	}
	gb, err := mb.Lock(ctx)
	if err != nil {
		return err
	}
	defer gb.Unlock(ctx)
	if gb.Token() <= ga.Token() {
		return fmt.Errorf("token %d after %d", gb.Token(), ga.Token())
	}
	fmt.Println("lock: held in turn, tokens increase")
	return nil
}

// elect has two sessions campaign: the first leads, the second takes over
// when it resigns.
func elect(ctx context.Context, a, b *zk.Conn, path string) error {
	ea, err := election.New(a, path)
	if err != nil {
		return err
	}
	defer ea.Close()
	eb, err := election.New(b, path)
	if err != nil {
		return err
	}
	defer eb.Close()
	if err := ea.Campaign(ctx, []byte("a")); err != nil {
		return err
	}
	second := make(chan error, 1)
	go func() { second <- eb.Campaign(ctx, []byte("b")) }()
	if l, err := eb.Leader(ctx); err != nil || string(l.Value) != "a" {
		return fmt.Errorf("leader before the handover: %v, %v; want a", l, err)
	}
	if err := ea.Resign(ctx); err != nil {
		return err
	}
	if err := <-second; err != nil {
		return err
	}
	l, err := ea.Leader(ctx)
	if err != nil || string(l.Value) != "b" {
		return fmt.Errorf("leader after the handover: %v, %v; want b", l, err)
	}
	fmt.Println("election: a led, then b")
	return eb.Resign(ctx)
}

// count adds from both sessions, eight goroutines on each, and swaps the
// sum back to 0 from one only if nobody added since it was read.
func count(ctx context.Context, a, b *zk.Conn, path string) error {
	ca, err := counter.New(a, path)
	if err != nil {
		return err
	}
	cb, err := counter.New(b, path)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := c.Add(ctx, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	v, err := cb.Get(ctx)
	if err != nil || v != 160 {
		return fmt.Errorf("after 160 Adds: %d, %v", v, err)
	}
	if ok, err := ca.CompareAndSet(ctx, v, 0); err != nil || !ok {
		return fmt.Errorf("CompareAndSet(%d, 0): %v, %v", v, ok, err)
	}
	fmt.Println("counter: 160 Adds from two sessions, then reset")
	return nil
}
