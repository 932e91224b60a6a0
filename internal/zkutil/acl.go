package zkutil

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/go-zookeeper/zk"
)

// OpenACL is the ACL of nodes created without one: anyone may do anything.
// It is what the recipes use unless given an ACL.
func OpenACL() []zk.ACL { return zk.WorldACL(zk.PermAll) }

// ACLOr returns acl, or OpenACL when acl is empty: the one place a recipe
// picks the ACL of the nodes it creates.
func ACLOr(acl []zk.ACL) []zk.ACL {
	if len(acl) == 0 {
		return OpenACL()
	}
	return acl
}

// ParseDigest checks a digest credential "user:password": a non-empty user
// without ':' and a non-empty password.
func ParseDigest(cred string) (user, password string, err error) {
	user, password, ok := strings.Cut(cred, ":")
	if !ok || user == "" || password == "" {
		return "", "", errors.New("zk digest credential is not user:password")
	}
	return user, password, nil
}

// DigestACL is the ACL that lets only the identity of digest credential
// cred ("user:password") write, create, delete and administer a node;
// with worldRead anyone may also read it.
func DigestACL(cred string, worldRead bool) ([]zk.ACL, error) {
	user, password, err := ParseDigest(cred)
	if err != nil {
		return nil, err
	}
	acl := zk.DigestACL(zk.PermAll, user, password)
	if worldRead {
		acl = append(acl, zk.WorldACL(zk.PermRead)...)
	}
	return acl, nil
}

// ReadDigestFile reads a digest credential from a file: its first line,
// "user:password" (or "digest:user:password"), surrounding blanks ignored.
// A file others may read is refused: the password would leak.
func ReadDigestFile(name string) (string, error) {
	st, err := os.Stat(name)
	if err != nil {
		return "", fmt.Errorf("zk auth file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("zk auth file %s is readable by others (mode %v): chmod 600 it", name, st.Mode().Perm())
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("zk auth file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "digest:")
	if _, _, err := ParseDigest(line); err != nil {
		return "", fmt.Errorf("zk auth file %s: %w", name, err)
	}
	return line, nil
}

// Authenticate adds the digest credential cred to conn's session, waiting
// for the answer until ctx ends. The client keeps the credential and sends
// it again, before any other request, on every later connection and new
// session, so it is added once per Conn, before the Conn's first request.
// When ctx ends first the caller must close conn, which ends the wait.
func Authenticate(ctx context.Context, conn *zk.Conn, cred string) error {
	if _, _, err := ParseDigest(cred); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- conn.AddAuth("digest", []byte(cred)) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("zk add auth: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("zk add auth: %w", ctx.Err())
	}
}

// WorldWritable reports whether acl lets anyone (world:anyone) write,
// create or delete.
func WorldWritable(acl []zk.ACL) bool {
	for _, a := range acl {
		if a.Scheme == "world" && a.ID == "anyone" && a.Perms&(zk.PermWrite|zk.PermCreate|zk.PermDelete|zk.PermAdmin) != 0 {
			return true
		}
	}
	return false
}

// SameACL reports whether a and b hold the same entries, in any order.
func SameACL(a, b []zk.ACL) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if x == y {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// SetTreeACL sets acl on p and every node below it, children before their
// parent, so that an interrupted run leaves p as it was and is run again.
// Nodes that vanish meanwhile are skipped. It returns the count of nodes
// whose ACL it changed.
func SetTreeACL(ctx context.Context, conn *zk.Conn, p string, acl []zk.ACL) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	children, _, err := conn.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", p, err)
	}
	n := 0
	for _, c := range children {
		k, err := SetTreeACL(ctx, conn, path.Join(p, c), acl)
		n += k
		if err != nil {
			return n, err
		}
	}
	cur, _, err := conn.GetACL(p)
	if errors.Is(err, zk.ErrNoNode) {
		return n, nil
	}
	if err != nil {
		return n, fmt.Errorf("get acl %s: %w", p, err)
	}
	if SameACL(cur, acl) {
		return n, nil
	}
	if _, err := conn.SetACL(p, acl, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return n, fmt.Errorf("set acl %s: %w", p, err)
	}
	return n + 1, nil
}

// PrivateACL is acl without its world entries: the ACL of a node whose
// data is a secret (a signing key), which a world-read ACL must not
// extend to.
func PrivateACL(acl []zk.ACL) []zk.ACL {
	var out []zk.ACL
	for _, a := range acl {
		if a.Scheme != "world" {
			out = append(out, a)
		}
	}
	return out
}

// ACLError is the ACL of a tree's root that does not keep others out:
// writable by anyone (Open), or not granting the identity every
// permission it should have.
type ACLError struct {
	Path string
	ACL  []zk.ACL // the root's
	Open bool
}

func (e *ACLError) Error() string {
	if e.Open {
		return fmt.Sprintf("%s is writable by anyone (world:anyone)", e.Path)
	}
	return fmt.Sprintf("%s does not grant the identity all permissions (its ACL: %v)", e.Path, e.ACL)
}

// CheckRootACL checks that the node root, when it exists, is closed to
// others: not writable by anyone, and granting the identity of acl[0]
// (scheme and id) every permission acl[0] has. It returns nil when so, or
// when root does not exist or acl is empty (nodes open to anyone), an
// *ACLError when not.
func CheckRootACL(conn *zk.Conn, root string, acl []zk.ACL) error {
	if len(acl) == 0 {
		return nil
	}
	cur, _, err := conn.GetACL(root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get acl %s: %w", root, err)
	}
	open := WorldWritable(cur)
	if !open && grants(cur, acl[0]) {
		return nil
	}
	return &ACLError{Path: root, ACL: cur, Open: open}
}

// grants reports whether acl gives id's identity (scheme and id) every
// permission id has.
func grants(acl []zk.ACL, id zk.ACL) bool {
	for _, a := range acl {
		if a.Scheme == id.Scheme && a.ID == id.ID && a.Perms&id.Perms == id.Perms {
			return true
		}
	}
	return false
}

// SetPrivateACL sets PrivateACL(acl) on the node name under parent, if it
// exists: after SetTreeACL, a secret's node is given back the ACL that
// keeps its data from readers of the rest of the tree.
func SetPrivateACL(conn *zk.Conn, parent, name string, acl []zk.ACL) error {
	p := path.Join(parent, name)
	if _, err := conn.SetACL(p, PrivateACL(acl), -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("set acl %s: %w", p, err)
	}
	return nil
}

// LoadSecret returns the data of the node name under parent, a secret of
// random bytes shared by every process using parent: the first caller
// creates it (32 bytes, with PrivateACL(acl)). A secret shorter than min
// bytes is refused.
func LoadSecret(conn *zk.Conn, parent, name string, acl []zk.ACL, min int) ([]byte, error) {
	p := path.Join(parent, name)
	key, err := LoadOrCreate(conn, p, PrivateACL(acl), func() ([]byte, error) {
		key := make([]byte, max(32, min))
		_, err := rand.Read(key)
		return key, err
	})
	if err != nil {
		return nil, err
	}
	if len(key) < min {
		return nil, fmt.Errorf("%s holds %d bytes, want at least %d", p, len(key), min)
	}
	return key, nil
}
