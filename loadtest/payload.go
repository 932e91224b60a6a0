package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// A load-test payload identifies its message and carries its send time:
//
//	magic "QLT1" | producer uint32 | seq uint64 | sent (Unix ns) int64 | filler
//
// big endian. The filler up to --payload bytes is a pattern derived from
// producer and seq, so a corrupted or mixed-up payload is detected.
const headerLen = 4 + 4 + 8 + 8

var payloadMagic = [4]byte{'Q', 'L', 'T', '1'}

// msgKey identifies a message: its producer and its sequence (from 1).
type msgKey struct {
	Producer int
	Seq      uint64
}

func (k msgKey) String() string { return fmt.Sprintf("p%d#%d", k.Producer, k.Seq) }

// header is the decoded head of a payload.
type header struct {
	msgKey
	Sent time.Time
}

var errBadPayload = errors.New("not a load-test payload")

// encodePayload writes a payload of size bytes into buf (reused when large
// enough) and returns it.
func encodePayload(buf []byte, size int, k msgKey, sent time.Time) []byte {
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	b := buf[:size]
	copy(b, payloadMagic[:])
	binary.BigEndian.PutUint32(b[4:], uint32(k.Producer))
	binary.BigEndian.PutUint64(b[8:], k.Seq)
	binary.BigEndian.PutUint64(b[16:], uint64(sent.UnixNano()))
	f := keyHash(k)
	for i := headerLen; i < size; i++ {
		b[i] = fillerByte(f, i)
	}
	return b
}

// decodePayload parses and verifies a payload.
func decodePayload(b []byte) (header, error) {
	if len(b) < headerLen || [4]byte(b[:4]) != payloadMagic {
		return header{}, errBadPayload
	}
	h := header{msgKey: msgKey{
		Producer: int(binary.BigEndian.Uint32(b[4:])),
		Seq:      binary.BigEndian.Uint64(b[8:]),
	}}
	h.Sent = time.Unix(0, int64(binary.BigEndian.Uint64(b[16:])))
	f := keyHash(h.msgKey)
	for i := headerLen; i < len(b); i++ {
		if b[i] != fillerByte(f, i) {
			return header{}, fmt.Errorf("%w: %v: filler differs at byte %d", errBadPayload, h.msgKey, i)
		}
	}
	return h, nil
}

// keyHash mixes a key into 64 well-spread bits (splitmix64's finalizer).
func keyHash(k msgKey) uint64 {
	x := uint64(k.Producer)<<40 ^ k.Seq
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// fillerByte is byte i of a payload whose key hashes to h.
func fillerByte(h uint64, i int) byte { return byte(h>>(8*(i%8))) ^ byte(i) }

// shouldNack decides, the same way for every delivery of a message,
// whether the workload nacks its first delivery: a hash of the key below
// rate. Deterministic, so a re-run nacks the same messages.
func shouldNack(k msgKey, rate float64) bool {
	return rate > 0 && float64(keyHash(k)>>11)/(1<<53) < rate
}
