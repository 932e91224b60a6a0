package main

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Checker verifies the run's delivery guarantees from what producers and
// consumers report:
//
//   - every message whose publish succeeded is delivered (at-most-once)
//     or acked (at-least-once): otherwise it is lost;
//   - no message is delivered twice at-most-once, nor acked twice or
//     delivered again after its ack at-least-once: a duplicate;
//   - each consumer sees each producer's messages in increasing sequence
//     (per priority on priority queues): an order violation otherwise.
//     Only first deliveries are compared: a redelivery (after a nack or a
//     released lease) comes back behind newer messages by design. With
//     several consumers a queue promises no global order: each consumer's
//     own view is what is checked, and with several brokers, or claims
//     racing a re-scan, even that can invert, so --order report only
//     counts violations (as warnings);
//   - the delivered id matches the id Publish returned, and the payload
//     decodes with its filler intact.
//
// A message whose publish failed is "uncertain" when the failure leaves
// open whether it was applied (see refusedByBroker): it may or may not be
// in the queue, so it is never counted lost, but a second delivery of it
// is still a duplicate. A publish the broker refused (a full queue, a bad
// request) is certainly not applied: it is counted as refused, and a
// delivery of it is an unknown message.
//
// A Checker is safe for concurrent use.
type Checker struct {
	ackMode bool     // at-least-once: completion is the ack
	holds   *holdLog // --single-active: who held deliveries when (active.go)
	// ackLost, when set (--kill-active-after), reports whether consumer's
	// broker was killed: a stream ack it sent may have died with the
	// broker, unapplied, and the message come back and be acked again.
	ackLost func(consumer int) bool

	mu        sync.Mutex
	msgs      [][]msgState // by producer, then seq-1
	lastSeq   map[orderKey]uint64
	published int64 // publishes that succeeded
	uncertain int64
	refused   int64 // publishes the broker refused: certainly not applied
	completed int64 // published messages delivered/acked at least once
	dupAfter  int64 // at-least-once deliveries after an ack
	order     problemSet
	ids       problemSet
	corrupt   problemSet
	unknown   problemSet
}

type pubState uint8

const (
	notPublished pubState = iota
	publishedOK
	publishUncertain
	publishRefused
)

type msgState struct {
	id         string
	pub        pubState
	deliveries uint32
	acks       uint32
	ackedBy    int32 // the consumer of the first ack, plus 1
}

// orderKey is what order is checked within.
type orderKey struct {
	consumer, producer, priority int
}

// problemSet counts problems and keeps the first few for the report.
type problemSet struct {
	n       int64
	samples []string
}

const maxSamples = 5

func (p *problemSet) add(format string, args ...any) {
	p.n++
	if len(p.samples) < maxSamples {
		p.samples = append(p.samples, fmt.Sprintf(format, args...))
	}
}

// NewChecker returns a checker for producers producers; ackMode is true
// for at-least-once runs.
func NewChecker(producers int, ackMode bool) *Checker {
	return &Checker{ackMode: ackMode, msgs: make([][]msgState, producers), lastSeq: map[orderKey]uint64{}}
}

// state returns the message's state, growing the producer's table; nil
// for a key no producer of this run can have made.
func (c *Checker) state(k msgKey) *msgState {
	if k.Producer < 0 || k.Producer >= len(c.msgs) || k.Seq == 0 || k.Seq > 1<<40 {
		return nil
	}
	s := c.msgs[k.Producer]
	for uint64(len(s)) < k.Seq {
		s = append(s, msgState{})
	}
	c.msgs[k.Producer] = s
	return &s[k.Seq-1]
}

// lostAck reports whether the first ack of s went, on a stream, to a
// broker that was killed: it may not have been applied.
func (c *Checker) lostAck(s *msgState) bool {
	return c.ackLost != nil && s.ackedBy > 0 && c.ackLost(int(s.ackedBy)-1)
}

func (c *Checker) done(s *msgState) bool {
	if c.ackMode {
		return s.acks > 0
	}
	return s.deliveries > 0
}

// Published records a publish: ok when it succeeded (id is then the id the
// broker returned), false when it failed and the message is uncertain.
func (c *Checker) Published(k msgKey, id string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(k)
	if s == nil || s.pub != notPublished {
		return // the producers never do this
	}
	if !ok {
		s.pub = publishUncertain
		c.uncertain++
		return
	}
	s.pub = publishedOK
	c.published++
	if s.id != "" && s.id != id {
		c.ids.add("%v published as %s, delivered as %s", k, id, s.id)
	}
	s.id = id
	if c.done(s) {
		c.completed++
	}
}

// Refused records a publish the broker refused: the message is not in the
// queue.
func (c *Checker) Refused(k msgKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(k)
	if s == nil || s.pub != notPublished {
		return // the producers never do this
	}
	s.pub = publishRefused
	c.refused++
}

// Delivered records a delivery to consumer; count is the message's
// delivery count (1 for a first delivery).
func (c *Checker) Delivered(consumer int, k msgKey, priority int, id string, count int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(k)
	if s == nil {
		c.unknown.add("%s carries %v, which no producer of this run published", id, k)
		return
	}
	switch {
	case s.id == "":
		s.id = id
	case s.id != id:
		c.ids.add("%v published as %s, delivered as %s", k, s.id, id)
	}
	s.deliveries++
	if c.ackMode && s.acks > 0 && !c.lostAck(s) {
		c.dupAfter++
	}
	if !c.ackMode && s.deliveries == 1 && s.pub == publishedOK {
		c.completed++
	}
	if count > 1 {
		return // a redelivery: order is not promised
	}
	ok := orderKey{consumer, k.Producer, priority}
	last := c.lastSeq[ok]
	if k.Seq < last {
		c.order.add("consumer %d got %v after p%d#%d", consumer, k, k.Producer, last)
		return
	}
	c.lastSeq[ok] = k.Seq
}

// Acked records a successful ack by consumer (at-least-once).
func (c *Checker) Acked(k msgKey, consumer int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(k)
	if s == nil {
		return // reported by Delivered
	}
	s.acks++
	if s.acks == 1 {
		s.ackedBy = int32(consumer) + 1
	}
	if c.ackMode && s.acks == 1 && s.pub == publishedOK {
		c.completed++
	}
}

// Held records that consumer held a delivery from from to to
// (--single-active); a no-op otherwise.
func (c *Checker) Held(consumer int, from, to time.Time) {
	if c.holds != nil {
		c.holds.held(consumer, from, to)
	}
}

// Corrupt records a delivery whose payload did not decode.
func (c *Checker) Corrupt(id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corrupt.add("%s: %v", id, err)
}

// Progress returns the successful publishes and how many of them are
// complete (delivered, or acked at-least-once).
func (c *Checker) Progress() (published, completed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.published, c.completed
}

// Verdict is the checker's conclusion.
type Verdict struct {
	Published    int64 `json:"published"`
	Uncertain    int64 `json:"uncertain_publishes"`
	Refused      int64 `json:"refused_publishes"`
	Delivered    int64 `json:"delivered"`
	Deliveries   int64 `json:"deliveries"`
	Redeliveries int64 `json:"redeliveries"`
	Acked        int64 `json:"acked"`
	// AckedAgain: messages acked a second time after their first ack,
	// sent on the stream of a broker then killed, died with it unapplied
	// (--kill-active-after); not duplicates.
	AckedAgain      int64 `json:"acked_again,omitempty"`
	Lost            int64 `json:"lost"`
	Duplicates      int64 `json:"duplicates"`
	OrderViolations int64 `json:"order_violations"`
	IDMismatches    int64 `json:"id_mismatches"`
	Corrupt         int64 `json:"corrupt"`
	Unknown         int64 `json:"unknown"`
	// SingleActive: with --single-active, the check that no two streams
	// held deliveries at once (active.go).
	SingleActive *ActiveCheck `json:"single_active,omitempty"`
	OK           bool         `json:"ok"`
	// Problems fail the verdict; Warnings (order violations under
	// --order report) do not.
	Problems []string `json:"problems,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// Verdict checks everything recorded so far. strictOrder makes order
// violations fail the verdict.
func (c *Checker) Verdict(strictOrder bool) Verdict {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := Verdict{Published: c.published, Uncertain: c.uncertain, Refused: c.refused}
	var lost, dup problemSet
	unknown := problemSet{n: c.unknown.n, samples: slices.Clone(c.unknown.samples)}
	for p, msgs := range c.msgs {
		for i := range msgs {
			s := &msgs[i]
			k := msgKey{Producer: p, Seq: uint64(i) + 1}
			if s.deliveries > 0 {
				v.Delivered++
				v.Deliveries += int64(s.deliveries)
				v.Redeliveries += int64(s.deliveries) - 1
			}
			if s.acks > 0 {
				v.Acked++
			}
			switch {
			case s.pub == publishedOK && !c.done(s):
				lost.add("%v (%s) never %s", k, orNone(s.id), c.completion())
			case !c.ackMode && s.deliveries > 1:
				dup.add("%v (%s) delivered %d times", k, s.id, s.deliveries)
			case c.ackMode && s.acks == 2 && c.lostAck(s):
				v.AckedAgain++
			case c.ackMode && s.acks > 1:
				dup.add("%v (%s) acked %d times", k, s.id, s.acks)
			}
			switch {
			case s.pub == notPublished && s.deliveries > 0:
				unknown.add("%v (%s) delivered but never published", k, s.id)
			case s.pub == publishRefused && s.deliveries > 0:
				unknown.add("%v (%s) delivered but its publish was refused", k, s.id)
			}
		}
	}
	if c.dupAfter > 0 && dup.n == 0 {
		dup.add("%d deliveries after an ack", c.dupAfter)
	}
	v.Lost, v.Duplicates = lost.n, dup.n
	v.OrderViolations, v.IDMismatches = c.order.n, c.ids.n
	v.Corrupt, v.Unknown = c.corrupt.n, unknown.n
	v.Problems = append(v.Problems, describe("lost", lost)...)
	v.Problems = append(v.Problems, describe("duplicate", dup)...)
	if strictOrder {
		v.Problems = append(v.Problems, describe("order violation", c.order)...)
	} else {
		v.Warnings = describe("order violation", c.order)
	}
	v.Problems = append(v.Problems, describe("id mismatch", c.ids)...)
	v.Problems = append(v.Problems, describe("corrupt payload", c.corrupt)...)
	v.Problems = append(v.Problems, describe("unknown message", unknown)...)
	if c.holds != nil {
		v.SingleActive = c.holds.check()
		v.Problems = append(v.Problems, describe("single-active overlap", v.SingleActive.problems)...)
	}
	v.OK = v.Lost == 0 && v.Duplicates == 0 && v.IDMismatches == 0 && v.Corrupt == 0 && v.Unknown == 0 &&
		(v.OrderViolations == 0 || !strictOrder) && (v.SingleActive == nil || v.SingleActive.Overlaps == 0)
	return v
}

func (c *Checker) completion() string {
	if c.ackMode {
		return "acked"
	}
	return "delivered"
}

func describe(what string, p problemSet) []string {
	if p.n == 0 {
		return nil
	}
	s := fmt.Sprintf("%d %s", p.n, what)
	if p.n > 1 && what != "lost" {
		s += "s"
	}
	out := []string{s}
	for _, x := range p.samples {
		out = append(out, "  "+x)
	}
	return out
}

func orNone(id string) string {
	if id == "" {
		return "no id"
	}
	return id
}
