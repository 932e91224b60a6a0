package zkqueue

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// Message is one delivered (or peeked) message.
type Message struct {
	// ID is the message's node name, unique within its queue for the
	// queue's lifetime ("qn-0000000042", "p007-0000000042").
	ID string
	// Payload is the message body as published.
	Payload []byte
	// Priority is 0 for FIFO messages.
	Priority int
	// Published is when the message was first published.
	Published time.Time
	// Deliveries counts the claims of the message, this one included. It
	// is 1 on the first delivery and grows on every redelivery in
	// acknowledged mode.
	Deliveries int
}

// A message node's data is a small header followed by the payload:
//
//	magic (2 bytes: 0xCB 0x51) | version (1 byte: 1)
//	uvarint deliveries so far | varint published time (Unix ns)
//	payload
//
// Data without the magic is not a message: anything may have written it
// (a client of another recipe, or one that should not have), so it is
// refused rather than delivered as a bare payload.
var magic = [3]byte{0xCB, 0x51, 1}

// HeaderMax is the largest header EncodeData writes.
const HeaderMax = 3 + binary.MaxVarintLen64*2

// EncodeData returns the node data for a message.
func EncodeData(payload []byte, published time.Time, deliveries int) []byte {
	b := make([]byte, 0, HeaderMax+len(payload))
	b = append(b, magic[:]...)
	b = binary.AppendUvarint(b, uint64(deliveries))
	b = binary.AppendVarint(b, published.UnixNano())
	return append(b, payload...)
}

var errBadHeader = errors.New("bad message header")

// DecodeData parses node data written by EncodeData. Data without the
// header, with a header of another version or a truncated one is refused
// (errBadHeader). ctime is not used: every message carries its publish
// time.
func DecodeData(data []byte, ctime time.Time) (payload []byte, published time.Time, deliveries int, err error) {
	if len(data) < 3 || data[0] != magic[0] || data[1] != magic[1] || data[2] != magic[2] {
		return nil, time.Time{}, 0, errBadHeader
	}
	rest := data[3:]
	d, n := binary.Uvarint(rest)
	if n <= 0 || d > math.MaxInt32 {
		return nil, time.Time{}, 0, errBadHeader
	}
	rest = rest[n:]
	p, n := binary.Varint(rest)
	if n <= 0 {
		return nil, time.Time{}, 0, errBadHeader
	}
	return rest[n:], time.Unix(0, p), int(d), nil
}
