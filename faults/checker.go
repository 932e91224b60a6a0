package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Key identifies a message of a run: the producer that published it and
// its sequence number there (from 1). It travels in the payload, so a
// delivery is recognised whatever id or incarnation it arrives under.
type Key struct {
	Producer, Seq int
}

func (k Key) String() string { return fmt.Sprintf("p%d#%d", k.Producer, k.Seq) }

// payloadTag starts every payload of the suite.
const payloadTag = "qbf1|"

// Payload encodes k into a payload of at least size bytes.
func Payload(k Key, size int) []byte {
	b := fmt.Appendf(nil, "%s%d|%d|", payloadTag, k.Producer, k.Seq)
	for len(b) < size {
		b = append(b, byte('a'+len(b)%26))
	}
	return b
}

// ParsePayload returns the key Payload encoded in b.
func ParsePayload(b []byte) (Key, error) {
	rest, ok := bytes.CutPrefix(b, []byte(payloadTag))
	if !ok {
		return Key{}, errors.New("faults: payload without the suite's tag")
	}
	fields := bytes.SplitN(rest, []byte("|"), 3)
	if len(fields) != 3 {
		return Key{}, errors.New("faults: truncated payload")
	}
	p, err1 := strconv.Atoi(string(fields[0]))
	s, err2 := strconv.Atoi(string(fields[1]))
	if err1 != nil || err2 != nil || p < 0 || s < 1 {
		return Key{}, fmt.Errorf("faults: bad key %q|%q", fields[0], fields[1])
	}
	k := Key{Producer: p, Seq: s}
	for i, c := range fields[2] {
		if want := byte('a' + (len(b)-len(fields[2])+i)%26); c != want {
			return Key{}, fmt.Errorf("faults: payload of %v corrupt at byte %d", k, len(b)-len(fields[2])+i)
		}
	}
	return k, nil
}

// Code returns the gRPC code of an error from the client or gRPC: OK for
// nil, Canceled and DeadlineExceeded for context errors, Unknown for
// anything else without a status.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *qbroker.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, context.Canceled) {
		return codes.Canceled
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.Unknown
}

// Certain reports whether a failed call certainly changed nothing: the
// broker refused it (bad input, a missing queue, a limit). Any other
// failure (Unavailable, DeadlineExceeded, Canceled, Internal, ...) is
// uncertain: the call may have been applied.
func Certain(err error) bool {
	switch Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.ResourceExhausted, codes.PermissionDenied, codes.Unauthenticated, codes.OutOfRange,
		codes.Unimplemented:
		return true
	}
	return false
}

// StaleTolerance is how late past its lease deadline an at-least-once
// delivery may arrive before the checker calls it stale. It absorbs the
// transport and the consumer's own scheduling; a stale copy made by a
// paused broker or a stalled stream arrives seconds late.
const StaleTolerance = 250 * time.Millisecond

// Checker records the history of one queue under one delivery mode and
// judges it. It is told every publish (acknowledged, refused, or failed
// with an uncertain outcome), every delivery (key, delivery count, lease
// deadline, arrival time), every confirmed ack, every at-most-once
// receive that failed with an uncertain outcome, and the moments faults
// were injected and healed. From that it reports:
//
//   - lost: acknowledged publishes never delivered. At most once, a
//     receive that failed with an uncertain outcome may have claimed
//     (deleted) up to its maximum of messages that then never reached
//     the consumer, as the delivery contract allows (of a packed queue,
//     whole packs, up to a claim's worth of messages published before
//     the failure: PackReceiveFailed), and a killed broker loses what it
//     had claimed and not handed out (MayLose: its pack buffer and what
//     was in transit); such losses, up to that total, are "in doubt" and
//     not counted lost;
//   - duplicates (at most once): deliveries of a message beyond its
//     first;
//   - uncounted redeliveries (at least once): deliveries whose delivery
//     count does not exceed one seen before for the message (a second
//     copy with the same count, or a stale copy after a newer one), that
//     arrive after an ack of the message was confirmed, or that arrive
//     more than StaleTolerance after their own lease deadline (a stale
//     copy: its lease was gone before the consumer could use it);
//   - phantoms: deliveries of refused publishes, of messages never
//     published, and corrupt payloads;
//   - time to recover: from each fault (or heal) mark to the first
//     delivery of a message whose publish started after the mark.
//
// A Checker is safe for concurrent use.
type Checker struct {
	mode qbroker.DeliveryMode

	mu      sync.Mutex
	msgs    map[Key]*history
	marks   []Mark
	inDoubt int
	mayLose int // at most once: messages faults may have lost in brokers' claims (MayLose)
	// At most once, packed: what uncertain Receives' claims may have
	// taken beyond what the Receives asked for, and the last such
	// failure (PackReceiveFailed).
	claimDoubt  int
	claimBefore time.Time
	corrupt     problems
	failures    []string
	errs        map[string]int // failed calls by operation and code, for notes
}

type pubState uint8

const (
	notPublished pubState = iota
	publishedOK
	publishUncertain
	publishRefused
)

type history struct {
	pub        pubState
	pubStart   time.Time
	id         string // the id the publish returned; empty if unknown
	deliveries []Delivery
	ackedAt    time.Time // first confirmed ack; zero if none
}

// Delivery is one copy of a message that reached a consumer.
type Delivery struct {
	Key      Key
	ID       string
	Count    int       // delivery count the broker reported
	Deadline time.Time // lease deadline; zero at most once
	At       time.Time // when the consumer got it
	Consumer string
}

// MarkKind tells faults from heals.
type MarkKind int

// Mark kinds.
const (
	Fault MarkKind = iota
	Heal
)

// Mark is a moment a fault was injected or healed.
type Mark struct {
	Kind MarkKind
	What string
	At   time.Time
}

// NewChecker returns an empty checker for mode.
func NewChecker(mode qbroker.DeliveryMode) *Checker {
	return &Checker{mode: mode, msgs: map[Key]*history{}, errs: map[string]int{}}
}

// Mode returns the checker's delivery mode.
func (c *Checker) Mode() qbroker.DeliveryMode { return c.mode }

func (c *Checker) state(k Key) *history {
	h := c.msgs[k]
	if h == nil {
		h = &history{}
		c.msgs[k] = h
	}
	return h
}

// Published records the outcome of a publish of keys (one call, a batch
// when several) that started at start.
func (c *Checker) Published(keys []Key, start time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := publishedOK
	switch {
	case err == nil:
	case Certain(err):
		st = publishRefused
	default:
		st = publishUncertain
	}
	if err != nil {
		c.errs["publish "+Code(err).String()]++
	}
	for _, k := range keys {
		h := c.state(k)
		h.pub, h.pubStart = st, start
	}
}

// Stored records the ids an acknowledged publish of keys returned (in
// order), so that the problems of a message name it even when it was
// never delivered.
func (c *Checker) Stored(keys []Key, ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		if i < len(ids) {
			c.state(k).id = ids[i]
		}
	}
}

// MayLose records, at most once, that a fault may have lost up to n
// messages a broker had claimed (deleted from ZooKeeper) and not handed
// out: a killed broker loses what its takes of a packed queue buffered
// and what was in transit to its streams, as the delivery contract
// allows. Losses up to the total are "in doubt", as those of uncertain
// receives are. At least once it does nothing.
func (c *Checker) MayLose(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mode == qbroker.AtMostOnce {
		c.mayLose += n
	}
}

// Deliveries returns the deliveries of k so far, in the order recorded.
func (c *Checker) Deliveries(k Key) []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.msgs[k]; h != nil {
		return slices.Clone(h.deliveries)
	}
	return nil
}

// Delivered records a delivery.
func (c *Checker) Delivered(d Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.state(d.Key)
	h.deliveries = append(h.deliveries, d)
}

// Corrupt records a delivery whose payload did not decode.
func (c *Checker) Corrupt(id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corrupt.add("%s: %v", id, err)
}

// Acked records the outcome of an Ack call, made at `at`, for k. Only a
// confirmed ack (err nil) says the message is gone; acks sent on a
// Consume stream have no outcome and are not recorded.
func (c *Checker) Acked(k Key, at time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errs["ack "+Code(err).String()]++
		return
	}
	if h := c.state(k); h.ackedAt.IsZero() {
		h.ackedAt = at
	}
}

// ReceiveFailed records a failed Receive that asked for up to max
// messages. At most once, an uncertain failure may have claimed them.
func (c *Checker) ReceiveFailed(max int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs["receive "+Code(err).String()]++
	if c.mode == qbroker.AtMostOnce && !Certain(err) {
		c.inDoubt += max
	}
}

// PackReceiveFailed records a failed Receive of a packed queue, at `at`,
// that asked for up to max messages of a queue whose claims take whole
// packs, up to claim messages' worth. At most once, an uncertain failure
// may have lost more than a plain queue's Receive: the claim it waited
// for deletes whole packs, hands the Receive its share and buffers the
// rest in the broker, and when the claim's own outcome is uncertain (its
// connection lost as it committed) the broker buffers nothing and every
// pack it took is gone. So beside the max of ReceiveFailed, up to
// claim-max more messages are in doubt; and since a claim can only take
// messages already stored, only messages whose publish started before
// the last such failure can be among them. That keeps the bound tight
// where it matters: a loss of a message published after the last
// uncertain failure is never in doubt, whatever the sum.
func (c *Checker) PackReceiveFailed(max, claim int, at time.Time, err error) {
	c.ReceiveFailed(max, err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mode == qbroker.AtMostOnce && !Certain(err) {
		if claim > max {
			c.claimDoubt += claim - max
		}
		if at.After(c.claimBefore) {
			c.claimBefore = at
		}
	}
}

// Mark records a fault or a heal.
func (c *Checker) Mark(kind MarkKind, what string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marks = append(c.marks, Mark{Kind: kind, What: what, At: at})
}

// Fail records a problem found outside the history (a queue that did not
// drain, a leaked registration, a broken abuse check); it fails the
// verdict.
func (c *Checker) Fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = append(c.failures, fmt.Sprintf(format, args...))
}

// Progress returns how many publishes were acknowledged and how many of
// those messages were delivered so far.
func (c *Checker) Progress() (published, delivered int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.msgs {
		if h.pub == publishedOK {
			published++
			if len(h.deliveries) > 0 {
				delivered++
			}
		}
	}
	return published, delivered
}

// Missing returns how many acknowledged publishes were not delivered yet.
func (c *Checker) Missing() int {
	p, d := c.Progress()
	return p - d
}

// DeliveredAfter reports whether a message whose publish started at or
// after t was delivered: the path works end to end again.
func (c *Checker) DeliveredAfter(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.msgs {
		if h.pub == publishedOK && !h.pubStart.Before(t) && len(h.deliveries) > 0 {
			return true
		}
	}
	return false
}

// Result is a checker's verdict.
type Result struct {
	Mode        qbroker.DeliveryMode
	Published   int // acknowledged publishes
	Uncertain   int // publishes failed with an uncertain outcome
	Refused     int // publishes refused
	Delivered   int // distinct messages delivered
	Deliveries  int // all deliveries
	Redelivered int // deliveries with a count above 1 that are not uncounted
	Lost        int
	InDoubt     int // at most once: losses explained by uncertain receives
	Duplicates  int
	Uncounted   int
	Phantoms    int
	// RecoverFault and RecoverHeal are the longest time from a fault (or
	// heal) mark to the first delivery of a message published after it;
	// -1 when there is no such mark, or no such delivery (a problem).
	RecoverFault, RecoverHeal time.Duration
	Errors                    map[string]int
	Problems                  []string
	OK                        bool
}

// problems counts problems and keeps the first few for the report.
type problems struct {
	n       int
	samples []string
}

const maxSamples = 5

func (p *problems) add(format string, args ...any) {
	p.n++
	if len(p.samples) < maxSamples {
		p.samples = append(p.samples, fmt.Sprintf(format, args...))
	}
}

func (p problems) describe(what string) []string {
	if p.n == 0 {
		return nil
	}
	out := []string{fmt.Sprintf("%d %s", p.n, what)}
	for _, s := range p.samples {
		out = append(out, "  "+s)
	}
	return out
}

// Result judges everything recorded so far.
func (c *Checker) Result() Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Result{Mode: c.mode, Errors: map[string]int{}}
	for k, v := range c.errs {
		r.Errors[k] = v
	}
	var j judged
	for _, k := range c.sortedKeys() {
		c.judge(k, &r, &j)
	}
	r.Uncounted = j.uncounted.n
	r.Phantoms = j.phantom.n + c.corrupt.n
	if c.mode == qbroker.AtMostOnce {
		r.InDoubt = min(j.lost.n, c.inDoubt+c.mayLose+min(c.claimDoubt, j.lostBefore))
	}
	r.Lost = j.lost.n - r.InDoubt
	c.judgeRecovery(&r)
	if r.Lost > 0 {
		j.lost.n = r.Lost // the samples may include losses in doubt
		r.Problems = append(r.Problems, j.lost.describe("lost")...)
	}
	r.Problems = append(r.Problems, j.dup.describe("duplicated")...)
	r.Problems = append(r.Problems, j.uncounted.describe("uncounted redeliveries")...)
	r.Problems = append(r.Problems, j.phantom.describe("phantom deliveries")...)
	r.Problems = append(r.Problems, c.corrupt.describe("corrupt payloads")...)
	r.Problems = append(r.Problems, c.failures...)
	r.OK = len(r.Problems) == 0
	return r
}

// judged holds the problems Result found, by kind.
type judged struct {
	lost, dup, uncounted, phantom problems
	lostBefore                    int // lost, published before the last uncertain packed Receive (claimBefore)
}

// sortedKeys returns the keys of the messages recorded, by producer and
// sequence number.
func (c *Checker) sortedKeys() []Key {
	keys := make([]Key, 0, len(c.msgs))
	for k := range c.msgs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if a.Producer != b.Producer {
			return a.Producer - b.Producer
		}
		return a.Seq - b.Seq
	})
	return keys
}

// judge counts the publish and the deliveries of message k in r and its
// problems in j.
func (c *Checker) judge(k Key, r *Result, j *judged) {
	h := c.msgs[k]
	switch h.pub {
	case publishedOK:
		r.Published++
	case publishUncertain:
		r.Uncertain++
	case publishRefused:
		r.Refused++
	}
	ds := slices.Clone(h.deliveries)
	slices.SortStableFunc(ds, func(a, b Delivery) int { return a.At.Compare(b.At) })
	if len(ds) > 0 {
		r.Delivered++
		r.Deliveries += len(ds)
	}
	if h.pub == publishedOK && len(ds) == 0 && h.pubStart.Before(c.claimBefore) {
		j.lostBefore++
	}
	switch {
	case h.pub == publishedOK && len(ds) == 0 && h.id != "":
		j.lost.add("%v (%s) never delivered", k, h.id)
	case h.pub == publishedOK && len(ds) == 0:
		j.lost.add("%v never delivered", k)
	case h.pub == publishRefused && len(ds) > 0:
		j.phantom.add("%v delivered (%s) after its publish was refused", k, ds[0].ID)
	case h.pub == notPublished && len(ds) > 0:
		j.phantom.add("%v delivered (%s) but never published", k, ds[0].ID)
	}
	if c.mode == qbroker.AtMostOnce {
		if len(ds) > 1 {
			j.dup.add("%v delivered %d times (%s)", k, len(ds), describeDeliveries(ds))
			r.Duplicates += len(ds) - 1
		}
		return
	}
	judgeRedeliveries(k, h, ds, r, &j.uncounted)
}

// judgeRedeliveries counts, at least once, the redeliveries of message k
// (its deliveries ds in time order) in r, and in uncounted those that do
// not count: a delivery count that did not grow, a delivery after the
// ack was confirmed, or one past its lease deadline.
func judgeRedeliveries(k Key, h *history, ds []Delivery, r *Result, uncounted *problems) {
	maxCount := 0
	for i, d := range ds {
		reason := ""
		switch {
		case i > 0 && d.Count <= maxCount:
			reason = fmt.Sprintf("count %d after count %d", d.Count, maxCount)
		case !h.ackedAt.IsZero() && d.At.After(h.ackedAt):
			reason = fmt.Sprintf("arrived %v after its ack was confirmed", d.At.Sub(h.ackedAt).Round(time.Millisecond))
		case !d.Deadline.IsZero() && d.At.Sub(d.Deadline) > StaleTolerance:
			reason = fmt.Sprintf("arrived %v after its lease deadline", d.At.Sub(d.Deadline).Round(time.Millisecond))
		}
		if reason != "" {
			uncounted.add("%v to %s: %s (%s)", k, d.Consumer, reason, describeDeliveries(ds))
		} else if d.Count > 1 {
			r.Redelivered++
		}
		maxCount = max(maxCount, d.Count)
	}
}

// judgeRecovery sets r's recovery times from the marks, and adds a
// problem for a mark after which nothing published was delivered.
func (c *Checker) judgeRecovery(r *Result) {
	r.RecoverFault, r.RecoverHeal = -1, -1
	for _, m := range c.marks {
		d, ok := c.recovery(m.At)
		if !ok {
			r.Problems = append(r.Problems, fmt.Sprintf("nothing published after %q was delivered", m.What))
			continue
		}
		if m.Kind == Fault {
			r.RecoverFault = max(r.RecoverFault, d)
		} else {
			r.RecoverHeal = max(r.RecoverHeal, d)
		}
	}
}

// recovery is the time from t to the first delivery of a message whose
// acknowledged publish started at or after t.
func (c *Checker) recovery(t time.Time) (time.Duration, bool) {
	var first time.Time
	for _, h := range c.msgs {
		if h.pub != publishedOK || h.pubStart.Before(t) {
			continue
		}
		for _, d := range h.deliveries {
			if first.IsZero() || d.At.Before(first) {
				first = d.At
			}
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return first.Sub(t), true
}

func describeDeliveries(ds []Delivery) string {
	var b bytes.Buffer
	t0 := ds[0].At
	for i, d := range ds {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "#%d %s to %s at +%v", d.Count, d.ID, d.Consumer, d.At.Sub(t0).Round(time.Millisecond))
		if !d.Deadline.IsZero() {
			fmt.Fprintf(&b, " (deadline %+v)", d.Deadline.Sub(d.At).Round(time.Millisecond))
		}
	}
	return b.String()
}
