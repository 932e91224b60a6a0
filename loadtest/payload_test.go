package main

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestPayloadRoundTrip(t *testing.T) {
	sent := time.Unix(1700000000, 123456789)
	for _, size := range []int{headerLen, 100, 4096} {
		k := msgKey{Producer: 7, Seq: 1<<33 + 5}
		b := encodePayload(nil, size, k, sent)
		if len(b) != size {
			t.Fatalf("got %d bytes, want %d", len(b), size)
		}
		h, err := decodePayload(b)
		if err != nil {
			t.Fatal(err)
		}
		if h.msgKey != k || !h.Sent.Equal(sent) {
			t.Errorf("got %v %v, want %v %v", h.msgKey, h.Sent, k, sent)
		}
	}
}

func TestPayloadCorruption(t *testing.T) {
	b := encodePayload(nil, 100, msgKey{1, 2}, time.Now())
	for name, mutate := range map[string]func([]byte) []byte{
		"filler":    func(b []byte) []byte { b[60] ^= 1; return b },
		"magic":     func(b []byte) []byte { b[0] = 'X'; return b },
		"short":     func(b []byte) []byte { return b[:headerLen-1] },
		"other key": func(b []byte) []byte { b[11]++; return b },
	} {
		c := append([]byte(nil), b...)
		if _, err := decodePayload(mutate(c)); !errors.Is(err, errBadPayload) {
			t.Errorf("%s: got %v, want errBadPayload", name, err)
		}
	}
}

func TestShouldNack(t *testing.T) {
	for _, rate := range []float64{0, 0.1, 0.5, 1} {
		n := 0
		const total = 20000
		for s := 1; s <= total; s++ {
			k := msgKey{Producer: s % 8, Seq: uint64(s)}
			if shouldNack(k, rate) != shouldNack(k, rate) {
				t.Fatal("not deterministic")
			}
			if shouldNack(k, rate) {
				n++
			}
		}
		if got := float64(n) / total; math.Abs(got-rate) > 0.02 {
			t.Errorf("rate %v: nacked %v", rate, got)
		}
	}
}
