package zkutil

import (
	"context"
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
