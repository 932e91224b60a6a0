package zkutil

import (
	"bytes"
	"encoding/binary"
)

// ownedMagic starts the data of a coordination node (a lock holder, an
// election candidate) that records who owns it beside its value.
var ownedMagic = []byte{0, 'q', 'o', 1}

// maxOwner bounds an owner's name in node data.
const maxOwner = 1024

// EncodeOwned returns a coordination node's data: value alone when owner
// is empty and value cannot be taken for an encoded node, otherwise
// ownedMagic, the owner's length (uvarint), the owner, then value. A
// value that starts with ownedMagic is always wrapped, so no value can
// pass itself off as another owner's node.
func EncodeOwned(owner string, value []byte) []byte {
	if owner == "" && !bytes.HasPrefix(value, ownedMagic) {
		return value
	}
	out := make([]byte, 0, len(ownedMagic)+binary.MaxVarintLen64+len(owner)+len(value))
	out = append(out, ownedMagic...)
	out = binary.AppendUvarint(out, uint64(len(owner)))
	out = append(out, owner...)
	return append(out, value...)
}

// DecodeOwned splits data written by EncodeOwned into owner and value.
// Data that EncodeOwned did not wrap is a value without an owner.
func DecodeOwned(data []byte) (owner string, value []byte) {
	rest, ok := bytes.CutPrefix(data, ownedMagic)
	if !ok {
		return "", data
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > maxOwner || uint64(len(rest)-k) < n {
		return "", data
	}
	return string(rest[k : k+int(n)]), rest[k+int(n):]
}
