package zkqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"
	"unicode/utf8"
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
	// Attributes are the metadata published with the message.
	Attributes
	// Ready is when the message last became ready, if not at its publish:
	// when it was due (a delayed message) or redriven. A queue's message
	// TTL counts from it (see ttl.go); zero: from Published.
	Ready time.Time
}

// Attributes are a message's optional metadata, stored in its node beside
// the payload and delivered with it.
type Attributes struct {
	// ContentType describes the payload ("application/json"); free-form.
	ContentType string
	// Headers are string key/value pairs.
	Headers map[string]string
	// Group, when set, puts the message in a message group (groups.go):
	// the messages of one group are delivered in publish order, one at
	// a time. See CheckGroup for its charset.
	Group string
	// groupEntry names the message's entry in its group: the token
	// chosen at publish, or the entry's node name once claimed.
	groupEntry string
}

// Bounds on Attributes, checked by Validate. They keep a message's
// metadata small next to the node size limit; the bytes count against the
// payload limit too (see Queue.CheckMessage).
const (
	MaxHeaders        = 64
	MaxHeaderKey      = 256
	MaxAttributeBytes = 16 << 10
)

// ErrBadAttributes is returned for attributes outside the bounds above or
// not valid UTF-8.
var ErrBadAttributes = errors.New("bad message attributes")

// Validate checks a's bounds: at most MaxHeaders headers, non-empty keys
// of at most MaxHeaderKey bytes, everything valid UTF-8, and at most
// MaxAttributeBytes encoded.
func (a Attributes) Validate() error {
	if len(a.Headers) > MaxHeaders {
		return fmt.Errorf("%w: %d headers > %d", ErrBadAttributes, len(a.Headers), MaxHeaders)
	}
	if !utf8.ValidString(a.ContentType) {
		return fmt.Errorf("%w: content type is not UTF-8", ErrBadAttributes)
	}
	for k, v := range a.Headers {
		switch {
		case k == "":
			return fmt.Errorf("%w: empty header key", ErrBadAttributes)
		case len(k) > MaxHeaderKey:
			return fmt.Errorf("%w: header key %.32q... is %d bytes > %d", ErrBadAttributes, k, len(k), MaxHeaderKey)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return fmt.Errorf("%w: header %.32q is not UTF-8", ErrBadAttributes, k)
		}
	}
	if a.Group != "" {
		if err := CheckGroup(a.Group); err != nil {
			return err
		}
	}
	if n := a.Size(); n > MaxAttributeBytes {
		return fmt.Errorf("%w: %d bytes > %d", ErrBadAttributes, n, MaxAttributeBytes)
	}
	return nil
}

// Size is the number of bytes a adds to a message node.
func (a Attributes) Size() int {
	if a.empty() {
		return 0
	}
	return len(a.appendTo(nil))
}

// wireSize is what m counts against a Room: its payload and attributes.
func (m *Message) wireSize() int { return len(m.Payload) + m.Attributes.Size() }

func (a Attributes) empty() bool {
	return a.ContentType == "" && len(a.Headers) == 0 && a.Group == "" && a.groupEntry == ""
}

// Attribute tags. A decoder skips tags it does not know, so a newer broker
// may add some without breaking an older one.
const (
	tagContentType = 1
	tagHeader      = 2
	tagGroup       = 5 // Attributes.Group
	tagGroupEntry  = 6 // Attributes.groupEntry
)

// appendTo appends a's encoding: a sequence of tag byte, uvarint length,
// value. A header's value is uvarint key length, key, value. Headers are
// written in key order so equal attributes encode equally.
func (a Attributes) appendTo(b []byte) []byte {
	if a.ContentType != "" {
		b = appendField(b, tagContentType, nil, a.ContentType)
	}
	keys := make([]string, 0, len(a.Headers))
	for k := range a.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b = appendField(b, tagHeader, []byte(k), a.Headers[k])
	}
	if a.Group != "" {
		b = appendField(b, tagGroup, nil, a.Group)
	}
	if a.groupEntry != "" {
		b = appendField(b, tagGroupEntry, nil, a.groupEntry)
	}
	return b
}

func appendField(b []byte, tag byte, key []byte, value string) []byte {
	b = append(b, tag)
	n := len(value)
	if key != nil {
		n += uvarintLen(uint64(len(key))) + len(key)
	}
	b = binary.AppendUvarint(b, uint64(n))
	if key != nil {
		b = binary.AppendUvarint(b, uint64(len(key)))
		b = append(b, key...)
	}
	return append(b, value...)
}

func uvarintLen(x uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], x)
}

func decodeAttributes(b []byte) (Attributes, error) {
	var a Attributes
	for len(b) > 0 {
		tag := b[0]
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || n > uint64(len(b)-1-k) {
			return Attributes{}, errBadHeader
		}
		field := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		switch tag {
		case tagContentType:
			a.ContentType = string(field)
		case tagHeader:
			kl, k := binary.Uvarint(field)
			if k <= 0 || kl > uint64(len(field)-k) {
				return Attributes{}, errBadHeader
			}
			if a.Headers == nil {
				a.Headers = make(map[string]string)
			}
			a.Headers[string(field[k:k+int(kl)])] = string(field[k+int(kl):])
		case tagGroup:
			a.Group = string(field)
		case tagGroupEntry:
			a.groupEntry = string(field)
		}
	}
	return a, nil
}

// A message node's data is a small header followed by the payload:
//
//	magic (2 bytes: 0xCB 0x51) | version (1 byte: 1 or 2)
//	uvarint deliveries so far | varint published time (Unix ns)
//	version 2 only: uvarint attributes length | attributes
//	payload
//
// A message without attributes is written as version 1, so plain messages
// cost nothing extra. Data without the magic is not a message: anything
// may have written it (a client of another recipe, or one that should not
// have), so it is refused rather than delivered as a bare payload.
var magic = [2]byte{0xCB, 0x51}

const (
	version1 = 1 // no attributes
	version2 = 2 // attributes before the payload
)

// HeaderMax is the largest header EncodeData writes for a message without
// attributes; attributes add Attributes.Size plus a uvarint.
const HeaderMax = 3 + binary.MaxVarintLen64*2

// EncodeData returns the node data for a message: m's payload, attributes,
// publish time and deliveries (ID and Priority are in the node's name).
func EncodeData(m Message) []byte {
	b := make([]byte, 0, HeaderMax+len(m.Payload))
	version := byte(version1)
	if !m.Attributes.empty() || !m.Ready.IsZero() {
		version = version2
	}
	b = append(b, magic[0], magic[1], version)
	b = binary.AppendUvarint(b, uint64(m.Deliveries))
	b = binary.AppendVarint(b, m.Published.UnixNano())
	if version == version2 {
		attrs := appendReady(m.Attributes.appendTo(nil), m.Ready)
		b = binary.AppendUvarint(b, uint64(len(attrs)))
		b = append(b, attrs...)
	}
	return append(b, m.Payload...)
}

var errBadHeader = errors.New("bad message header")

// DecodeData parses node data written by EncodeData into a Message
// without ID and Priority. Data without the header, with a header of
// another version or a truncated one is refused (errBadHeader).
func DecodeData(data []byte) (Message, error) {
	if len(data) < 3 || data[0] != magic[0] || data[1] != magic[1] || (data[2] != version1 && data[2] != version2) {
		return Message{}, errBadHeader
	}
	version, rest := data[2], data[3:]
	d, n := binary.Uvarint(rest)
	if n <= 0 || d > math.MaxInt32 {
		return Message{}, errBadHeader
	}
	rest = rest[n:]
	p, n := binary.Varint(rest)
	if n <= 0 {
		return Message{}, errBadHeader
	}
	rest = rest[n:]
	m := Message{Published: time.Unix(0, p), Deliveries: int(d)}
	if version == version2 {
		l, n := binary.Uvarint(rest)
		if n <= 0 || l > uint64(len(rest)-n) {
			return Message{}, errBadHeader
		}
		a, err := decodeAttributes(rest[n : n+int(l)])
		if err != nil {
			return Message{}, err
		}
		ready, err := decodeReady(rest[n : n+int(l)])
		if err != nil {
			return Message{}, err
		}
		m.Attributes, m.Ready, rest = a, ready, rest[n+int(l):]
	}
	m.Payload = rest
	return m, nil
}

// decodeMessage decodes the data of message node n, its id and priority
// from the name, with addDeliveries added to its delivery count (1 for a
// claim).
func decodeMessage(n Name, data []byte, addDeliveries int) (Message, error) {
	m, err := DecodeData(data)
	if err != nil {
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
	}
	m.ID, m.Priority = n.Base, n.Priority
	m.Deliveries += addDeliveries
	return m, nil
}
