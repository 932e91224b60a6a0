package broker

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/zkqueue"
)

// A token signed by makeToken parses back to its hint and is trusted
// under the same key only: an edited hint, a foreign key or a missing mac
// are not. The longest queue name takes the signer past its stack buffer.
func TestAckTokenSignature(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	signer, other := newTokenSigner(key), newTokenSigner([]byte("another key, also 32 bytes long!"))
	lease := zkqueue.Lease{Token: "qn-0000000001.00000001~0123456789abcdef", Deadline: time.UnixMilli(1_700_000_000_123)}
	lease.Deliveries, lease.Payload = 3, make([]byte, 100)

	for _, queue := range []string{"orders", strings.Repeat("q", MaxNameLen)} {
		tok := makeToken(signer, queue, lease)
		p, err := parseToken(tok)
		if err != nil {
			t.Fatalf("parseToken(%q): %v", tok, err)
		}
		if p.queue != queue || p.lease != lease.Token || !p.deadline.Equal(lease.Deadline) || p.deliveries != 3 || p.size != 100 {
			t.Errorf("parseToken(makeToken) = %+v", p)
		}
		if !p.trusted(signer) {
			t.Errorf("token for queue of %d bytes not trusted by its own key", len(queue))
		}
		if p.trusted(other) {
			t.Error("token trusted under another key")
		}
		forged := strings.Replace(tok, "/1700000000123.", "/1800000000123.", 1)
		if f, err := parseToken(forged); err != nil || f.trusted(signer) {
			t.Errorf("edited hint: parse %v, trusted %v; want parsed and untrusted", err, err == nil && f.trusted(signer))
		}
		bare := tok[:strings.LastIndexByte(tok, '.')]
		if f, err := parseToken(bare); err != nil || f.trusted(signer) {
			t.Errorf("token without mac: parse %v, want parsed and untrusted", err)
		}
	}

	// The pooled hashes give every goroutine the same answer.
	want := makeToken(signer, "orders", lease)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if got := makeToken(signer, "orders", lease); got != want {
					t.Errorf("concurrent makeToken = %q, want %q", got, want)
					return
				}
			}
		}()
	}
	wg.Wait()

	for _, bad := range []string{"", "orders", "or ders/qn-0000000001~0123456789abcdef", "orders/nolease", "orders/qn-0000000001~0123456789abcdef/x.y.z"} {
		if _, err := parseToken(bad); err == nil {
			t.Errorf("parseToken(%q) ok, want malformed", bad)
		}
	}
}
