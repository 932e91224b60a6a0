package zkqueue

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A pack and a pack lease decode to what was encoded; any truncation of
// either, and random bytes behind their headers, are refused, never a
// panic.
func TestPackCodecs(t *testing.T) {
	var entries []packEntry
	var live []leaseEntry
	for i := range 50 {
		entries = append(entries, packEntry{index: 3 + i*7, data: EncodeData(Message{Payload: make([]byte, i), Published: time.Unix(0, int64(i))})})
		live = append(live, leaseEntry{index: 3 + i*7, deadline: time.Unix(0, int64(-i))})
	}
	data, ldata := encodePack(entries), encodePackLease(live)
	got, err := decodePack(data)
	if err != nil || len(got) != len(entries) {
		t.Fatalf("decodePack: %d entries, %v", len(got), err)
	}
	for i, e := range got {
		if e.index != entries[i].index || string(e.data) != string(entries[i].data) {
			t.Fatalf("entry %d: %d %q, want %d %q", i, e.index, e.data, entries[i].index, entries[i].data)
		}
	}
	gotl, err := decodePackLease(ldata)
	if err != nil || len(gotl) != len(live) || gotl[9] != live[9] {
		t.Fatalf("decodePackLease: %v, %v", gotl, err)
	}
	for n := 3; n < len(data); n++ {
		if _, err := decodePack(data[:n]); err == nil {
			t.Fatalf("a pack cut at %d of %d bytes decoded", n, len(data))
		}
	}
	for n := 3; n < len(ldata); n++ {
		if es, err := decodePackLease(ldata[:n]); err == nil && len(es) == len(live) {
			t.Fatalf("a lease cut at %d of %d bytes decoded whole", n, len(ldata))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		b := make([]byte, 3+r.IntN(64))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		copy(b, data[:3])
		_, _ = decodePack(b)
		copy(b, ldata[:3])
		_, _ = decodePackLease(b)
	}
}

// A pack message's token parses only with an index in range, written
// canonically, on the lease of a pack.
func TestParseMemberToken(t *testing.T) {
	const lease = "qn-7-n20-0000000042~0123456789abcdef"
	for token, want := range map[string]bool{
		lease + "@1": true, lease + "@20": true, lease + "@4095": true,
		lease + "@0": false, lease + "@-1": false, lease + "@01": false, lease + "@4096": false, lease + "@x": false,
		lease + "@1@2": false, "qn-7-0000000042~0123456789abcdef@1": false, // not a pack's lease
	} {
		if _, ok := ParseLeaseName(token); ok != want {
			t.Errorf("ParseLeaseName(%q): ok %v, want %v", token, ok, want)
		}
	}
}
