package zkqueue

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseName(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		prio int
		seq  int32
	}{
		{"qn-0000000000", true, 0, 0},
		{"qn-0000000042", true, 0, 42},
		{"qn-2147483647", true, 0, 2147483647},
		{"qn--2147483648", true, 0, -2147483648},
		{"qn--0000000001", true, 0, -1},
		{"p007-0000000012", true, 7, 12},
		{"p255-0000000001", true, 255, 1},
		{"p000--0000000005", true, 0, -5},
		{"p256-0000000001", false, 0, 0},
		{"p-01-0000000001", false, 0, 0},
		{"p7-0000000001", false, 0, 0},
		{"qn-42", false, 0, 0},
		{"qn-+000000042", false, 0, 0},
		{"qn-2147483648", false, 0, 0},
		{"qn-00000000x1", false, 0, 0},
		{"leases", false, 0, 0},
		{"", false, 0, 0},
		{"qn-", false, 0, 0},
		{"qn-0000000042.0a1b2c3d", true, 0, 42},
		{"p003-0000000042.ffffffff", true, 3, 42},
		{"qn-0000000042.", false, 0, 0},
		{"qn-0000000042.0A1B2C3D", false, 0, 0},
		{"qn-0000000042.0a1b2c3", false, 0, 0},
		{"qn-0000000042.0a1b2c3d.0a1b2c3d", false, 0, 0},
		{"qn-12-0000000042", true, 0, 42},
		{"qn-12-3fa0-0000000042", true, 0, 42},
		{"p007-3-0000-0000000042.0a1b2c3d", true, 7, 42},
		{"qn-12-3fA0-0000000042", false, 0, 0},
		{"qn-12-3fa-0000000042", false, 0, 0},
		{"qn-12-3fa0--000000042", false, 0, 0},
		{"qn-12-3fa0-", false, 0, 0},
		{"qn-12--0000000042", false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			n, ok := ParseName(tt.in)
			if ok != tt.ok {
				t.Fatalf("ParseName(%q) ok = %v, want %v", tt.in, ok, tt.ok)
			}
			if ok && (n.Priority != tt.prio || n.Seq != tt.seq || n.Raw != tt.in || n.Base != tt.in[:min(len(tt.in), len(tt.in)-len(tt.in)+len(n.Base))]) {
				t.Fatalf("ParseName(%q) = %+v, want priority %d seq %d", tt.in, n, tt.prio, tt.seq)
			}
		})
	}
}

func TestSortNamesNumeric(t *testing.T) {
	in := []string{
		"qn-0000000010", "qn-0000000009", "foreign", "qn--2147483648",
		"qn-0000000100", "qn--0000000001", "qn-1000000000",
	}
	names, foreign := SortNames(in)
	var got []string
	for _, n := range names {
		got = append(got, n.Raw)
	}
	want := []string{
		"qn--2147483648", "qn--0000000001", "qn-0000000009", "qn-0000000010",
		"qn-0000000100", "qn-1000000000",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if !slices.Equal(foreign, []string{"foreign"}) {
		t.Errorf("foreign = %v, want [foreign]", foreign)
	}
}

func TestSortNamesPriority(t *testing.T) {
	in := []string{"p010-0000000001", "p002-0000000009", "p002-0000000003", "p000-0000000100"}
	names, _ := SortNames(in)
	var got []string
	for _, n := range names {
		got = append(got, n.Raw)
	}
	want := []string{"p000-0000000100", "p002-0000000003", "p002-0000000009", "p010-0000000001"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestDataRoundTrip(t *testing.T) {
	pub := time.Unix(1700000000, 123456789)
	attrs := []Attributes{{}, {ContentType: "application/json"},
		{ContentType: "text/plain", Headers: map[string]string{"trace": "abc", "empty": "", "ünï": "çødé"}}}
	for _, payload := range [][]byte{nil, []byte("hello"), make([]byte, 1<<16)} {
		for _, a := range attrs {
			data := EncodeData(Message{Payload: payload, Published: pub, Deliveries: 3, Attributes: a})
			if a.empty() != (data[2] == version1) {
				t.Errorf("attributes %+v written as version %d", a, data[2])
			}
			m, err := DecodeData(data)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Payload, payload) && !(len(m.Payload) == 0 && len(payload) == 0) {
				t.Errorf("payload len %d, want %d", len(m.Payload), len(payload))
			}
			if !m.Published.Equal(pub) || m.Deliveries != 3 {
				t.Errorf("got (%v, %d), want (%v, 3)", m.Published, m.Deliveries, pub)
			}
			if m.ContentType != a.ContentType || !maps.Equal(m.Headers, a.Headers) {
				t.Errorf("attributes %+v, want %+v", m.Attributes, a)
			}
			if got := len(data) - len(EncodeData(Message{Payload: payload, Published: pub, Deliveries: 3})); a.Size() > got {
				t.Errorf("Size() = %d, more than the %d bytes the attributes add", a.Size(), got)
			}
		}
	}
	// Data without the header is not a message.
	for _, raw := range []string{"raw", "", "garbage"} {
		if m, err := DecodeData([]byte(raw)); err == nil {
			t.Errorf("data %q without a header: got payload %q, want an error", raw, m.Payload)
		}
	}
	// A header of an unknown version is corrupt, not a payload.
	if _, err := DecodeData([]byte{0xCB, 0x51, 9, 1}); err == nil {
		t.Error("unknown header version: got nil error")
	}
	if _, err := DecodeData([]byte{0xCB, 0x51, 1, 0x80}); err == nil {
		t.Error("truncated header: got nil error")
	}
	// Attributes longer than the data are corrupt.
	if _, err := DecodeData([]byte{0xCB, 0x51, 2, 0, 0, 9, 1}); err == nil {
		t.Error("truncated attributes: got nil error")
	}
	// An unknown attribute tag is skipped.
	m, err := DecodeData([]byte{0xCB, 0x51, 2, 0, 0, 3, 99, 1, 'x', 'p'})
	if err != nil || string(m.Payload) != "p" {
		t.Errorf("unknown tag: got %q, %v; want payload \"p\"", m.Payload, err)
	}
}

func TestAttributesValidate(t *testing.T) {
	many := map[string]string{}
	for i := range MaxHeaders + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	bad := []Attributes{
		{Headers: many},
		{Headers: map[string]string{"": "v"}},
		{Headers: map[string]string{strings.Repeat("k", MaxHeaderKey+1): "v"}},
		{Headers: map[string]string{"k": "\xff"}},
		{ContentType: "\xfe"},
		{Headers: map[string]string{"big": strings.Repeat("v", MaxAttributeBytes)}},
	}
	for _, a := range bad {
		if err := a.Validate(); !errors.Is(err, ErrBadAttributes) {
			t.Errorf("Validate(%.60v) = %v, want ErrBadAttributes", a, err)
		}
	}
	if err := (Attributes{ContentType: "a/b", Headers: map[string]string{"k": "v"}}).Validate(); err != nil {
		t.Errorf("valid attributes: %v", err)
	}
}

func FuzzDecodeData(f *testing.F) {
	f.Add(EncodeData(Message{Payload: []byte("x"), Published: time.Unix(1, 0), Deliveries: 1}))
	f.Add(EncodeData(Message{Payload: []byte("x"), Attributes: Attributes{ContentType: "t", Headers: map[string]string{"a": "b"}}}))
	f.Add([]byte{0xCB, 0x51, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeData(data)
		if err != nil {
			return
		}
		// What decodes re-encodes to something that decodes the same.
		again, err := DecodeData(EncodeData(m))
		if err != nil || !bytes.Equal(again.Payload, m.Payload) || again.ContentType != m.ContentType || !maps.Equal(again.Headers, m.Headers) {
			t.Fatalf("re-encoding %x: %+v, %v", data, again, err)
		}
	})
}

func TestIncarnationKeepsPlace(t *testing.T) {
	names, _ := SortNames([]string{"qn-0000000003", "qn-0000000001.00000001", "qn-0000000002"})
	if names[0].Raw != "qn-0000000001.00000001" || names[0].Base != "qn-0000000001" {
		t.Errorf("got head %+v, want the requeued qn-0000000001", names[0])
	}
	if _, ok := ParseLeaseName("qn-0000000001.00000001~0123456789abcdef"); !ok {
		t.Error("lease name of a requeued message did not parse")
	}
	for _, bad := range []string{"qn-0000000001", "qn-0000000001~0123", "qn-0000000001~0123456789abcdeg", "x~0123456789abcdef"} {
		if _, ok := ParseLeaseName(bad); ok {
			t.Errorf("ParseLeaseName(%q) ok, want rejected", bad)
		}
	}
}

func TestSplitShare(t *testing.T) {
	names, _ := SortNames([]string{"qn-0000000000", "qn-0000000001", "qn-0000000002", "qn-0000000003", "qn-0000000004", "qn--0000000003"})
	mine, others := splitShare(names, shareFunc(1, 2))
	// -3 as uint32 is odd: rank 1's.
	if m, o := seqs(mine), seqs(others); !slices.Equal(m, []int32{-3, 1, 3}) || !slices.Equal(o, []int32{0, 2, 4}) {
		t.Errorf("rank 1 of 2: mine %v, others %v; want [-3 1 3], [0 2 4]", m, o)
	}
	all, none := splitShare(names, nil)
	if len(all) != len(names) || none != nil {
		t.Errorf("no share: got %d and %d, want all and none", len(all), len(none))
	}
	all, _ = splitShare(names, shareFunc(3, 2)) // rank not in the registry yet
	if len(all) != len(names) {
		t.Errorf("bad rank: got %d, want all %d", len(all), len(names))
	}
}

func shareFunc(rank, n int, publishers ...string) func() Share {
	return func() Share { return Share{Rank: rank, N: n, Publishers: publishers} }
}

func seqs(names []Name) []int32 {
	var out []int32
	for _, n := range names {
		out = append(out, n.Seq)
	}
	return out
}

// A message published by a consuming process is that process's, up to
// ownWindow of them in a snapshot; messages of anyone else, and those past
// the window, go by sequence number.
func TestSplitShareByPublisher(t *testing.T) {
	a, b, c := PublisherTag("broker-a"), PublisherTag("broker-b"), PublisherTag("broker-c")
	if a == b || a == c || b == c {
		t.Fatalf("test tags collide: %s %s %s", a, b, c)
	}
	name := func(tag string, seq int) string {
		return fmt.Sprintf("%s%010d", messagePrefix(false, segment{0, 1}, tag, ""), seq)
	}
	// seq:   0  1  2  3  4  5
	// tag:   a  a  b  -  c  a   (c publishes but does not consume)
	names, foreign := SortNames([]string{name(a, 0), name(a, 1), name(b, 2), name("", 3), name(c, 4), name(a, 5)})
	if len(foreign) != 0 {
		t.Fatalf("foreign %v", foreign)
	}
	mineA, othersA := splitShare(names, shareFunc(0, 2, a, b))
	mineB, othersB := splitShare(names, shareFunc(1, 2, a, b))
	if m, o := seqs(mineA), seqs(othersA); !slices.Equal(m, []int32{0, 1, 4, 5}) || !slices.Equal(o, []int32{2, 3}) {
		t.Errorf("a: mine %v others %v, want [0 1 4 5] [2 3]", m, o)
	}
	if m := seqs(mineB); !slices.Equal(m, []int32{2, 3}) || !slices.Equal(seqs(othersB), seqs(mineA)) {
		t.Errorf("b: mine %v others %v, want [2 3] and a's", m, seqs(othersB))
	}
	// Publishers unknown (WithShare): by sequence number alone.
	if m := seqs(first(splitShare(names, shareFunc(0, 2)))); !slices.Equal(m, []int32{0, 2, 4}) {
		t.Errorf("no publishers: mine %v, want [0 2 4]", m)
	}
	// Two consuming processes with one tag: their messages are no one's.
	if m := seqs(first(splitShare(names, shareFunc(1, 3, b, a, a)))); !slices.Equal(m, []int32{1, 4}) {
		t.Errorf("shared tag: rank 1 of 3 mine %v, want [1 4]", m)
	}

	// Past ownWindow, the others help with a publisher's backlog, each
	// with its messages by sequence number past helpMargin; the rest waits
	// for the publisher's window.
	var deep []string
	for i := range ownWindow + helpMargin + 4 {
		deep = append(deep, name(a, i))
	}
	names, _ = SortNames(deep)
	mineA, othersA = splitShare(names, shareFunc(0, 2, a, b))
	mineB, othersB = splitShare(names, shareFunc(1, 2, a, b))
	if len(mineA) != ownWindow || seqs(mineA)[ownWindow-1] != ownWindow-1 {
		t.Errorf("deep: a has %d up to %d, want its window, %d", len(mineA), seqs(mineA)[len(mineA)-1], ownWindow)
	}
	if w := ownWindow + helpMargin; !slices.Equal(seqs(mineB), []int32{int32(w + 1), int32(w + 3)}) {
		t.Errorf("deep: b has %v, want [%d %d]", seqs(mineB), w+1, w+3)
	}
	if len(othersA)+len(othersB) != 2*len(names)-ownWindow-2 {
		t.Errorf("deep: %d and %d others, want the rest", len(othersA), len(othersB))
	}
}

func first(mine, _ []Name) []Name { return mine }

// segmentName writes what the layout documents (zero-padded numbers, so
// string and numeric order agree) and parseSegment reads it back.
func TestSegmentNameFormat(t *testing.T) {
	for _, tc := range []struct {
		prio bool
		sg   segment
	}{{false, segment{0, 1}}, {false, segment{0, 7}}, {false, segment{0, 1<<63 - 1}}, {true, segment{3, 2}}, {true, segment{255, 1234567890123}}} {
		var want string
		if tc.prio {
			want = fmt.Sprintf("p%03d-s%0*d", tc.sg.level, segDigits, tc.sg.k)
		} else {
			want = fmt.Sprintf("s%0*d", segDigits, tc.sg.k)
		}
		got := segmentName(tc.prio, tc.sg)
		if got != want {
			t.Errorf("segmentName(%v, %+v) = %q, want %q", tc.prio, tc.sg, got, want)
		}
		if sg, prio, ok := parseSegment(got); !ok || sg != tc.sg || prio != tc.prio {
			t.Errorf("parseSegment(%q) = %+v, %v, %v", got, sg, prio, ok)
		}
	}
}
