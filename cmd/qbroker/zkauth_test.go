package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// `qbroker dev` writes its credential once, readable by its owner only,
// and finds the same one again; serve reads it.
func TestDevAuthFile(t *testing.T) {
	dir := t.TempDir()
	p, err := ensureDevAuth(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v, %v; want mode 0600", st, err)
	}
	cred, err := zkutil.ReadDigestFile(p)
	if err != nil || !strings.HasPrefix(cred, "qbroker:") || len(cred) < 30 {
		t.Fatalf("ReadDigestFile = %q, %v; want qbroker:<random>", cred, err)
	}
	again, err := ensureDevAuth(dir)
	if err != nil || again != p {
		t.Fatalf("second ensureDevAuth = %q, %v; want %q", again, err, p)
	}
	if cred2, _ := zkutil.ReadDigestFile(p); cred2 != cred {
		t.Fatal("the credential changed")
	}

	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o := serveFlags(fs)
	if err := fs.Parse([]string{"--zk-auth-file", p}); err != nil {
		t.Fatal(err)
	}
	if d, err := o.zkAuth.digest(); err != nil || d != cred {
		t.Fatalf("digest() = %q, %v; want the file's credential", d, err)
	}
}

// A credential file others can read, or one that is not user:password,
// is refused; --zk-world-read and --zk-migrate-acl need a credential.
func TestZKAuthFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("u:p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := zkutil.ReadDigestFile(open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable file: got %v, want a refusal saying chmod 600", err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("nocolon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := zkutil.ReadDigestFile(bad); err == nil {
		t.Error("credential without ':': got no error")
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o := serveFlags(fs)
	if err := fs.Parse([]string{"--zk-migrate-acl"}); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--zk-auth-file") {
		t.Errorf("--zk-migrate-acl alone: got %v, want an error naming --zk-auth-file", err)
	}
}

// serve refuses a ZooKeeper tree it would leave open to every ZooKeeper
// client unless --zk-auth-file gives a credential or --insecure says so;
// dev, which makes a credential of its own, passes.
func TestServeRefusesOpenZooKeeper(t *testing.T) {
	for _, tt := range []struct {
		args []string
		dev  bool
		want string // substring of the error; "" means accepted
	}{
		{[]string{"--root", "/prod"}, false, "without --zk-auth-file every node under ZooKeeper root /prod would be writable by anyone"},
		{nil, false, "or --insecure to run with open nodes"},
		{[]string{"--zk-auth-file", "zk-auth"}, false, ""},
		{[]string{"--insecure"}, false, ""},
		{nil, true, ""},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		o := serveFlags(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		o.zkAuth.generated = tt.dev
		err := o.validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%v (dev %v): got %v, want no error", tt.args, tt.dev, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%v (dev %v): got %v, want an error with %q", tt.args, tt.dev, err, tt.want)
		}
	}
}
