package zkqueue_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/qbroker/qbroker/zkqueue"
)

// Quotas are stored under their own keys, left out when unset (so a spec
// without them encodes as before), and survive a round trip; negative
// ones are refused.
func TestSpecQuotas(t *testing.T) {
	s := zkqueue.Spec{Kind: zkqueue.KindFIFO, Visibility: time.Second, MaxDepth: 5000, MaxBytes: 1 << 30,
		Created: time.Date(2024, 5, 1, 2, 3, 4, 0, time.UTC)}
	data, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	const stored = `{"v":1,"kind":"fifo","visibility_ms":1000,"max_depth":5000,"max_bytes":1073741824,"created":"2024-05-01T02:03:04Z"}`
	if string(data) != stored {
		t.Fatalf("encoded %s, want %s", data, stored)
	}
	if got, err := zkqueue.DecodeSpec(data); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, s)
	}
	for _, bad := range []zkqueue.Spec{
		{Kind: zkqueue.KindFIFO, MaxDepth: -1},
		{Kind: zkqueue.KindFIFO, MaxBytes: -1},
	} {
		if err := bad.Validate(); !errors.Is(err, zkqueue.ErrBadSpec) {
			t.Errorf("Validate(%+v): got %v, want ErrBadSpec", bad, err)
		}
	}
}
