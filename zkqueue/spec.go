package zkqueue

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"
)

// Kind is a queue's kind, as a Catalog stores it.
type Kind string

// The kinds of queue.
const (
	KindFIFO     Kind = "fifo"
	KindPriority Kind = "priority"
	KindSync     Kind = "sync"
)

// Spec is a queue's configuration: the data of its node in a Catalog,
// stored as versioned JSON (see Encode).
//
// Deleting marks a queue that Catalog.Delete is removing. The mark is set
// with a versioned setData, the only write of a queue's metadata after
// its creation, so the version it produces identifies this incarnation of
// the queue while its nodes are deleted, and the change fires every
// metadata watch (Catalog.Load): a queue marked so is absent to every
// call but Delete and Create, which finish the deletion.
type Spec struct {
	Kind          Kind
	SyncMembers   int           // KindSync: the size of the group
	Visibility    time.Duration // a lease's default duration; stored in milliseconds
	MaxDeliveries int           // 0: unbounded
	DeadLetter    bool          // past MaxDeliveries: dead letter, not dropped
	// MaxDepth and MaxBytes are the queue's quotas: the most ready
	// messages, and the most bytes of message data under its items
	// parent; 0 means none. The engine stores them; whoever publishes
	// enforces them (the broker does).
	MaxDepth int
	MaxBytes int64
	// DedupWindow is how long publishes' dedup ids are remembered (see
	// dedup.go); 0 means DefaultDedupWindow. Stored in milliseconds.
	DedupWindow time.Duration
	Created     time.Time
	Deleting    bool

	// MessageTTL: ready messages older than this are expired (ttl.go);
	// 0 means none, else within [MinMessageTTL, MaxMessageTTL]; stored in
	// milliseconds. ExpireToDeadLetter keeps them as dead letters.
	MessageTTL         time.Duration
	ExpireToDeadLetter bool

	// Backoff, when set, is the queue's redelivery schedule (backoff.go);
	// stored in milliseconds.
	Backoff *Backoff
	// SingleActive: one consumer at a time receives the queue's messages
	// (see active.go); KindFIFO and KindPriority only. The queue has an
	// active/ parent, the election of its consumers.
	SingleActive bool
	// Fairness: the queue's fair dispatch by key (fairness.go); the zero
	// Fairness means none.
	Fairness Fairness
	// Packed: the queue stores many messages per node (pack.go); not
	// with Fairness or a MessageTTL, and not for KindSync.
	Packed bool
}

// specVersion is the version of the encoding; decoders reject the
// versions they do not know.
const specVersion = 1

// specJSON is the stored form of a Spec.
type specJSON struct {
	V             int       `json:"v"`
	Kind          Kind      `json:"kind"`
	SyncMembers   int       `json:"sync_members,omitempty"`
	VisibilityMS  int64     `json:"visibility_ms"`
	MaxDeliveries int       `json:"max_deliveries,omitempty"`
	DeadLetter    bool      `json:"dead_letter,omitempty"`
	MaxDepth      int       `json:"max_depth,omitempty"`
	MaxBytes      int64     `json:"max_bytes,omitempty"`
	DedupWindowMS int64     `json:"dedup_window_ms,omitempty"`
	MessageTTLMS  int64     `json:"message_ttl_ms,omitempty"`
	ExpireToDead  bool      `json:"expire_to_dead_letter,omitempty"`
	Created       time.Time `json:"created"`
	Deleting      bool      `json:"deleting,omitempty"`

	RetryBackoff *backoffJSON `json:"retry_backoff,omitempty"`
	SingleActive bool         `json:"single_active,omitempty"`
	// Fair dispatch (fairness.go).
	FairnessKey     string         `json:"fairness_key,omitempty"`
	FairnessWeights map[string]int `json:"fairness_weights,omitempty"`
	Packed          bool           `json:"packed,omitempty"`
}

// Policy returns the delivery policy the spec sets for leases.
func (s Spec) Policy() Policy {
	return Policy{MaxDeliveries: s.MaxDeliveries, DeadLetter: s.DeadLetter, Backoff: s.Backoff}
}

// Dedup returns the queue's dedup window: DedupWindow, or the default.
func (s Spec) Dedup() time.Duration {
	if s.DedupWindow == 0 {
		return DefaultDedupWindow
	}
	return s.DedupWindow
}

// Validate checks a spec to create: a known kind, a group size of at
// least 2 for KindSync only, no negative durations or counts, a dedup
// window of 0 or in [MinDedupWindow, MaxDedupWindow], no mark.
func (s Spec) Validate() error {
	switch {
	case s.Kind != KindFIFO && s.Kind != KindPriority && s.Kind != KindSync:
		return fmt.Errorf("%w: unknown kind %q", ErrBadSpec, s.Kind)
	case s.Kind == KindSync && s.SyncMembers < 2:
		return fmt.Errorf("%w: %d sync members, want at least 2", ErrBadSpec, s.SyncMembers)
	case s.Kind != KindSync && s.SyncMembers != 0:
		return fmt.Errorf("%w: sync members are for %s queues only", ErrBadSpec, KindSync)
	case s.Visibility < 0 || s.MaxDeliveries < 0:
		return fmt.Errorf("%w: negative visibility or max deliveries", ErrBadSpec)
	case s.MaxDepth < 0 || s.MaxBytes < 0:
		return fmt.Errorf("%w: negative max depth or max bytes", ErrBadSpec)
	case s.DedupWindow != 0 && CheckDedupWindow(s.DedupWindow) != nil:
		return fmt.Errorf("%w: %v", ErrBadSpec, CheckDedupWindow(s.DedupWindow))
	case s.MessageTTL != 0 && (s.MessageTTL < MinMessageTTL || s.MessageTTL > MaxMessageTTL):
		return fmt.Errorf("%w: message TTL %v not 0 nor in [%v, %v]", ErrBadSpec, s.MessageTTL, MinMessageTTL, MaxMessageTTL)
	case s.MessageTTL == 0 && s.ExpireToDeadLetter:
		return fmt.Errorf("%w: expiring to the dead letters needs a message TTL", ErrBadSpec)
	case s.Deleting:
		return fmt.Errorf("%w: a new queue cannot be marked deleting", ErrBadSpec)
	case s.SingleActive && s.Kind == KindSync:
		return fmt.Errorf("%w: single active consumer is for %s and %s queues only", ErrBadSpec, KindFIFO, KindPriority)
	case (s.Fairness.Key != "" || s.Fairness.Weights != nil) && s.Fairness.Validate() != nil:
		return fmt.Errorf("%w: %v", ErrBadSpec, s.Fairness.Validate())
	case s.Fairness.Key != "" && s.Kind == KindSync:
		return fmt.Errorf("%w: fairness is for %s and %s queues only", ErrBadSpec, KindFIFO, KindPriority)
	case s.Packed && s.Kind == KindSync:
		return fmt.Errorf("%w: packed storage is for %s and %s queues only", ErrBadSpec, KindFIFO, KindPriority)
	case s.Packed && s.Fairness.Key != "":
		return fmt.Errorf("%w: packed storage and fair dispatch do not combine (a fairness key tags each message's node)", ErrBadSpec)
	case s.Packed && s.MessageTTL != 0:
		return fmt.Errorf("%w: packed storage and a message TTL do not combine (the TTL timer expires messages by node)", ErrBadSpec)
	case s.Backoff != nil:
		return s.Backoff.Check()
	}
	return nil
}

// sameConfig reports whether two specs are equal, creation time aside.
func (s Spec) sameConfig(o Spec) bool {
	s.Created, o.Created = time.Time{}, time.Time{}
	if s.Backoff != nil || o.Backoff != nil {
		if !equalBackoff(s.Backoff, o.Backoff) {
			return false
		}
		s.Backoff, o.Backoff = nil, nil
	}
	if s.Fairness.Key+o.Fairness.Key != "" && !s.Fairness.equal(o.Fairness) {
		return false
	}
	// Fairness holds a map, so the rest is compared field by field.
	s.Fairness, o.Fairness = Fairness{}, Fairness{}
	return reflect.DeepEqual(s, o)
}

// Encode returns the stored form of s (Visibility in whole milliseconds).
func (s Spec) Encode() ([]byte, error) {
	j := specJSON{V: specVersion, Kind: s.Kind, SyncMembers: s.SyncMembers,
		VisibilityMS: s.Visibility.Milliseconds(), MaxDeliveries: s.MaxDeliveries,
		DeadLetter: s.DeadLetter, MaxDepth: s.MaxDepth, MaxBytes: s.MaxBytes, DedupWindowMS: s.DedupWindow.Milliseconds(),
		Created: s.Created, Deleting: s.Deleting,
		MessageTTLMS: s.MessageTTL.Milliseconds(), ExpireToDead: s.ExpireToDeadLetter, SingleActive: s.SingleActive,
		FairnessKey: s.Fairness.Key, FairnessWeights: s.Fairness.Weights, Packed: s.Packed}
	if s.Backoff != nil {
		j.RetryBackoff = s.Backoff.toJSON()
	}
	return json.Marshal(j)
}

// DecodeSpec parses a stored spec. A spec marked Deleting decodes whatever
// else it says (a mark over metadata that did not decode carries nothing
// else); any other must have a known version and pass Validate (a known
// kind, a group size that fits it, no negative values): metadata written
// by anything but a Catalog is not trusted.
func DecodeSpec(data []byte) (Spec, error) {
	var j specJSON
	err := json.Unmarshal(data, &j)
	s := Spec{Kind: j.Kind, SyncMembers: j.SyncMembers, Visibility: time.Duration(j.VisibilityMS) * time.Millisecond,
		MaxDeliveries: j.MaxDeliveries, DeadLetter: j.DeadLetter, MaxDepth: j.MaxDepth, MaxBytes: j.MaxBytes,
		DedupWindow: time.Duration(j.DedupWindowMS) * time.Millisecond, Created: j.Created, Deleting: j.Deleting,
		MessageTTL: time.Duration(j.MessageTTLMS) * time.Millisecond, ExpireToDeadLetter: j.ExpireToDead,
		SingleActive: j.SingleActive, Fairness: Fairness{Key: j.FairnessKey, Weights: j.FairnessWeights}, Packed: j.Packed}
	if j.RetryBackoff != nil {
		s.Backoff = j.RetryBackoff.backoff()
	}
	switch {
	case err != nil:
		return s, fmt.Errorf("queue metadata: %w", err)
	case s.Deleting:
		return s, nil
	case j.V != specVersion:
		return s, fmt.Errorf("queue metadata version %d, want %d", j.V, specVersion)
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("queue metadata: %w", err)
	}
	return s, nil
}
