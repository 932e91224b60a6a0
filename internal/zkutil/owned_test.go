package zkutil_test

import (
	"bytes"
	"testing"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// EncodeOwned and DecodeOwned round-trip; a plain value stays plain, and
// a value dressed as another owner's node is wrapped, never taken for it.
func TestOwnedData(t *testing.T) {
	forged := zkutil.EncodeOwned("alice", []byte("x"))
	for _, tc := range []struct {
		owner string
		value []byte
		plain bool
	}{
		{"", []byte("plain"), true},
		{"", nil, true},
		{"bob", nil, false},
		{"bob", []byte("v"), false},
		{"", forged, false},    // bob-less data that looks encoded is wrapped
		{"bob", forged, false}, // and bob's stays bob's
	} {
		data := zkutil.EncodeOwned(tc.owner, tc.value)
		if tc.plain != bytes.Equal(data, tc.value) {
			t.Errorf("EncodeOwned(%q, %q) = %q: plain %v, want %v", tc.owner, tc.value, data, !tc.plain, tc.plain)
		}
		owner, value := zkutil.DecodeOwned(data)
		if owner != tc.owner || !bytes.Equal(value, tc.value) {
			t.Errorf("DecodeOwned(EncodeOwned(%q, %q)) = %q, %q", tc.owner, tc.value, owner, value)
		}
	}
}
