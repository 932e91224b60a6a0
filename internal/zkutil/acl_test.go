package zkutil_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// authConn is a session authenticated with the digest credential cred.
func authConn(t *testing.T, cred string) *zk.Conn {
	t.Helper()
	conn := zktest.Conn(t)
	if err := zkutil.Authenticate(context.Background(), conn, cred); err != nil {
		t.Fatal(err)
	}
	return conn
}

// CheckRootACL accepts a missing root and one closed to others that
// grants the identity all permissions; it names an open root and one of
// another identity. With no ACL (no credential) anything goes.
func TestCheckRootACL(t *testing.T) {
	conn := authConn(t, "broker:secret")
	acl, err := zkutil.DigestACL("broker:secret", true)
	if err != nil {
		t.Fatal(err)
	}
	root := zktest.Root(t)
	create(t, conn, root)
	if err := zkutil.CheckRootACL(conn, root+"/missing", acl); err != nil {
		t.Fatalf("missing root: %v, want nil", err)
	}
	var bad *zkutil.ACLError
	if err := zkutil.CheckRootACL(conn, root, acl); !errors.As(err, &bad) || !bad.Open || bad.Path != root {
		t.Fatalf("open root: %v, want an ACLError naming it open", err)
	}
	if err := zkutil.CheckRootACL(conn, root, nil); err != nil {
		t.Fatalf("open root without an ACL: %v, want nil", err)
	}
	if _, err := conn.Create(root+"/mine", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	if err := zkutil.CheckRootACL(conn, root+"/mine", acl); err != nil {
		t.Fatalf("closed root: %v, want nil", err)
	}
	other, err := zkutil.DigestACL("other:secret", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := zkutil.CheckRootACL(conn, root+"/mine", other); !errors.As(err, &bad) || bad.Open || len(bad.ACL) != 2 {
		t.Fatalf("root of another identity: %v, want an ACLError with its ACL", err)
	}
}

// LoadSecret creates the secret once, private to the identity even under
// a world-read ACL, and returns it to every caller; SetPrivateACL gives a
// secret back that ACL after a tree-wide SetTreeACL; a short secret is
// refused.
func TestLoadSecret(t *testing.T) {
	conn := authConn(t, "broker:secret")
	plain := zktest.Conn(t)
	acl, err := zkutil.DigestACL("broker:secret", true)
	if err != nil {
		t.Fatal(err)
	}
	root := zktest.Root(t)
	create(t, conn, root)
	key, err := zkutil.LoadSecret(conn, root, "key", acl, 16)
	if err != nil || len(key) != 32 {
		t.Fatalf("LoadSecret: %d bytes, %v; want 32", len(key), err)
	}
	again, err := zkutil.LoadSecret(authConn(t, "broker:secret"), root, "key", acl, 16)
	if err != nil || !bytes.Equal(again, key) {
		t.Fatalf("LoadSecret again: %x, %v; want %x", again, err, key)
	}
	if _, _, err := plain.Get(root + "/key"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("read by anyone: %v, want ErrNoAuth", err)
	}
	if _, err := zkutil.SetTreeACL(context.Background(), conn, root, acl); err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.Get(root + "/key"); err != nil {
		t.Fatalf("after SetTreeACL: %v, want the world-read ACL", err)
	}
	if err := zkutil.SetPrivateACL(conn, root, "key", acl); err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.Get(root + "/key"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("after SetPrivateACL: %v, want ErrNoAuth", err)
	}
	if err := zkutil.SetPrivateACL(conn, root, "missing", acl); err != nil {
		t.Fatalf("SetPrivateACL of a missing node: %v, want nil", err)
	}
	if _, err := conn.Create(root+"/short", []byte("short"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := zkutil.LoadSecret(conn, root, "short", acl, 16); err == nil || !strings.Contains(err.Error(), "holds 5 bytes") {
		t.Fatalf("short secret: %v, want refused", err)
	}
}
