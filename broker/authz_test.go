package broker_test

import (
	"strings"
	"testing"

	"github.com/qbroker/qbroker/broker"
)

func TestRules(t *testing.T) {
	r, err := broker.ParseRules([]byte(`
# comment
ops        admin            *
app        publish,consume  orders.*,billing
*          view             public.*
locker     lock             nightly-?
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id, action, name string
		want             bool
	}{
		{"ops", "delete", "anything", true},
		{"ops", "publish", "anything", false}, // admin is create, delete, purge, redrive
		{"ops", "view", "anything", true},     // implied by queue actions
		{"app", "publish", "orders.eu", true},
		{"app", "consume", "billing", true},
		{"app", "consume", "billing2", false},
		{"app", "consume", "orders", false},
		{"app", "delete", "orders.eu", false},
		{"app", "view", "orders.eu", true},
		{"app", "lock", "orders.eu", false},
		{"stranger", "view", "public.x", true},
		{"stranger", "consume", "public.x", false},
		{"locker", "lock", "nightly-1", true},
		{"locker", "lock", "nightly-10", false},
		{"locker", "view", "nightly-1", false}, // lock is not a queue action
		{"nobody", "publish", "orders.eu", false},
	} {
		if got := r.Allowed(tt.id, tt.action, tt.name); got != tt.want {
			t.Errorf("Allowed(%s, %s, %s): got %v, want %v", tt.id, tt.action, tt.name, got, tt.want)
		}
	}
	for _, bad := range []struct{ text, want string }{
		{"ops admin", "line 1: want"},
		{"ops fly *", `unknown action "fly"`},
		{"ops publish [", `bad pattern "["`},
		{"ops publish a,,b", `bad pattern ""`},
	} {
		if _, err := broker.ParseRules([]byte(bad.text)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseRules(%q): got %v, want %q", bad.text, err, bad.want)
		}
	}
}

func TestTokensFile(t *testing.T) {
	tok, line, err := broker.MintToken("svc")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, tok) {
		t.Fatalf("tokens-file line %q holds the token", line)
	}
	if _, err := broker.ParseTokens([]byte("# c\n\n" + line + "\n")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"svc " + tok, "svc sha256:abcd", "svc", "a b c"} {
		if _, err := broker.ParseTokens([]byte(bad)); err == nil {
			t.Errorf("ParseTokens(%q): got no error", bad)
		}
	}
	if _, _, err := broker.MintToken("has space"); err == nil {
		t.Error("MintToken accepted an identity with a space")
	}
}
