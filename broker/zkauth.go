package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// ZooKeeper authentication and ACLs. With Config.ZKDigest every session
// of the broker adds the digest credential before its first request (the
// client replays it on every reconnection and new session), and every
// node the broker creates carries zkACL: all permissions for that digest
// identity and none, or read only (ZKWorldRead), for anyone else. Brokers
// sharing a root share the credential. Without ZKDigest nodes are open
// to anyone, as before.
//
// A root created before authentication was configured is open to anyone;
// the broker refuses to start on it (checkRootACL) unless ZKMigrateACL
// says to set zkACL on the whole existing tree first.

// zkACL returns the ACL of the nodes the broker creates: nil (open) without
// a digest credential.
func (c *Config) zkACL() ([]zk.ACL, error) {
	if c.ZKDigest == "" {
		if c.ZKWorldRead || c.ZKMigrateACL {
			return nil, errors.New("broker: ZooKeeper world read and ACL migration need a digest credential")
		}
		return nil, nil
	}
	acl, err := zkutil.DigestACL(c.ZKDigest, c.ZKWorldRead)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	return acl, nil
}

// nodeACL is the ACL the broker gives node p: open above the root, acl
// at the root and below.
func (b *Broker) nodeACL(p string) []zk.ACL {
	if b.root.Contains(p) {
		return b.acl
	}
	return nil
}

// connect opens one ZooKeeper session and, with a digest credential,
// authenticates it before anything else uses it. The wait for the
// credential's answer (a session first) ends with ctx.
func (b *Broker) connect(ctx context.Context, onEvent func(zk.Event)) (*zk.Conn, error) {
	conn, err := zkutil.Connect(b.cfg.ZooKeeper, b.cfg.SessionTimeout, b.log, onEvent)
	if err != nil {
		return nil, err
	}
	if b.cfg.ZKDigest == "" {
		return conn, nil
	}
	if err := zkutil.Authenticate(ctx, conn, b.cfg.ZKDigest); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// migrateTimeout bounds an ACL migration: a tree of 100,000 nodes takes
// two requests each.
const migrateTimeout = 10 * time.Minute

// checkRootACL makes sure, when authentication is configured, that the
// root is not writable by anyone and grants the broker's identity every
// permission (zkutil.CheckRootACL): a missing root is created so later
// (EnsurePath); an open one is refused, or, with ZKMigrateACL, given zkACL
// with the whole tree below it, the token key keeping its private ACL (a
// migration also rewrites a root the identity cannot administer only if
// ZooKeeper lets it). The check needs the session.
func (b *Broker) checkRootACL(ctx context.Context) error {
	root := b.root.Path()
	err := zkutil.CheckRootACL(b.conn, root, b.acl)
	var bad *zkutil.ACLError
	if !errors.As(err, &bad) {
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		return nil
	}
	if !b.cfg.ZKMigrateACL {
		if bad.Open {
			return fmt.Errorf("broker: ZooKeeper root %s is writable by anyone (world:anyone), created without authentication; "+
				"start one broker once with --zk-migrate-acl to give the existing tree the brokers' ACL", root)
		}
		return fmt.Errorf("broker: ZooKeeper root %s does not grant the broker's identity all permissions (its ACL: %v); "+
			"start with the credential that created it", root, bad.ACL)
	}
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	start := time.Now()
	n, err := zkutil.SetTreeACL(ctx, b.conn, root, b.acl)
	if err != nil {
		return fmt.Errorf("broker: migrate the ACL of %s (%d nodes changed, run again to finish): %w", root, n, err)
	}
	if err := zkutil.SetPrivateACL(b.conn, root, tokenKeyNode, b.acl); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	b.log.Warn("migrated the ZooKeeper ACL of the broker's tree", "znode", root, "nodes", n,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}
