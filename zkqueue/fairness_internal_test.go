package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
)

// A key tag sits after the publisher tag, parses back, and a name without
// one parses as before.
func TestParseNameKeyTag(t *testing.T) {
	key := KeyTag("tenant-7")
	for _, tc := range []struct {
		name, tag, key string
		seq            int32
	}{
		{"qn-12-3fa0-k" + key + "-0000000042", "3fa0", key, 42},
		{"qn-12-k" + key + "-0000000042", "", key, 42},
		{"p007-3-k" + key + "-0000000001.0000000a", "", key, 1},
		{"qn-12-3fa0-0000000042", "3fa0", "", 42},
	} {
		n, ok := ParseName(tc.name)
		if !ok || n.Tag != tc.tag || n.Key != tc.key || n.Seq != tc.seq {
			t.Errorf("ParseName(%q) = %+v, %v; want tag %q key %q seq %d", tc.name, n, ok, tc.tag, tc.key, tc.seq)
		}
	}
	for _, bad := range []string{"qn-12-k" + key + "-", "qn-12-k" + key + "--0000000001", "qn-12-kxyz-0000000001"} {
		if n, ok := ParseName(bad); ok {
			t.Errorf("ParseName(%q) = %+v, want not ok", bad, n)
		}
	}
}

// The picker serves the keys present in turn, each for its weight,
// whatever their backlog, and picks the first message of a key.
func TestFairPickerWeightedRoundRobin(t *testing.T) {
	var names []Name
	seq := int32(0)
	add := func(key string, k int) {
		for range k {
			seq++
			names = append(names, Name{Raw: fmt.Sprint(seq), Key: KeyTag(key), Seq: seq})
		}
	}
	add("a", 100) // the backlog of a comes first
	add("b", 10)
	add("c", 10)
	p := newFairPicker(Fairness{Key: FairnessGroup, Weights: map[string]int{"c": 2}})
	var got []string
	byTag := map[string]string{KeyTag("a"): "a", KeyTag("b"): "b", KeyTag("c"): "c"}
	for range 12 {
		i := p.pick(names)
		if i > 0 && names[i-1].Key == names[i].Key {
			t.Fatalf("picked %v, not the first of its key", names[i])
		}
		got = append(got, byTag[names[i].Key])
		names = append(names[:i], names[i+1:]...)
	}
	counts := map[string]int{}
	for _, k := range got {
		counts[k]++
	}
	if counts["a"] != 3 || counts["b"] != 3 || counts["c"] != 6 {
		t.Fatalf("12 picks served %v (%s), want a 3, b 3, c 6", counts, strings.Join(got, ""))
	}
}

func TestFairnessValidate(t *testing.T) {
	for _, tc := range []struct {
		f    Fairness
		want string // in the error; "" for valid
	}{
		{Fairness{}, ""},
		{Fairness{Key: "group"}, ""},
		{Fairness{Key: "header:tenant", Weights: map[string]int{"t1": 100}}, ""},
		{Fairness{Key: "tenant"}, "fairness key"},
		{Fairness{Key: "header:"}, "fairness key"},
		{Fairness{Weights: map[string]int{"a": 1}}, "without a fairness key"},
		{Fairness{Key: "group", Weights: map[string]int{"a": 0}}, "fairness weight 0"},
		{Fairness{Key: "group", Weights: map[string]int{"a": 101}}, "fairness weight 101"},
		{Fairness{Key: "group", Weights: manyWeights(MaxFairnessWeights + 1)}, "fairness weights, at most"},
	} {
		err := tc.f.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tc.f, err)
		case tc.want != "" && (!errors.Is(err, ErrBadFairness) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Validate(%+v) = %v, want ErrBadFairness with %q", tc.f, err, tc.want)
		}
	}
}

func manyWeights(n int) map[string]int {
	m := map[string]int{}
	for i := range n {
		m[fmt.Sprint("k", i)] = 1
	}
	return m
}

// A message published through the Queue that consumes joins the fair
// dispatcher's snapshot as its publish returns, without a listing: here
// the snapshot is kept from being listed again for a change, and a quiet
// key's message published behind another key's backlog is still the next
// one taken, with no children request between its publish and its
// delivery.
func TestFairMergesOwnPublishes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var children atomic.Int64
	q, err := New(zktest.Conn(t), zktest.Root(t)+"/items", WithFairness(Fairness{Key: FairnessHeader + "tenant"}),
		WithPublisher("p1"), WithObserver(func(op string, _ time.Duration, _ error) {
			if op == "children" {
				children.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.TryDequeue(ctx); !errors.Is(err, ErrEmpty) {
		t.Fatalf("consuming the empty queue: %v", err) // now its publishes are noted
	}
	tenant := func(tn string, k int) []Draft {
		ds := make([]Draft, k)
		for i := range ds {
			ds[i] = Draft{Payload: []byte(fmt.Sprint(tn, i)), Attributes: Attributes{Headers: map[string]string{"tenant": tn}}}
		}
		return ds
	}
	if _, err := q.PublishAll(ctx, tenant("a", 50)); err != nil {
		t.Fatal(err)
	}
	if m, err := q.TryDequeue(ctx); err != nil || m.Headers["tenant"] != "a" {
		t.Fatalf("first take: %v, %v; want one of a", m.Headers, err)
	}
	q.disp.mu.Lock()
	q.disp.fair.every = time.Hour // no listing for a change from here on
	q.disp.mu.Unlock()
	before := children.Load()
	if _, err := q.PublishAll(ctx, tenant("b", 1)); err != nil {
		t.Fatal(err)
	}
	m, err := q.TryDequeue(ctx)
	if err != nil || m.Headers["tenant"] != "b" {
		t.Fatalf("take after b's publish: %v, %v; want b's message (a's turn is over)", m.Headers, err)
	}
	if n := children.Load() - before; n != 0 {
		t.Fatalf("%d children requests between b's publish and its delivery, want 0", n)
	}
}
