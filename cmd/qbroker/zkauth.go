package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// zkAuthOptions are the ZooKeeper authentication flags. The credential is
// read from a file, never a flag, so that it stays out of ps and shell
// histories.
type zkAuthOptions struct {
	file      string
	worldRead bool
	migrate   bool
	// generated: the caller (qbroker dev) supplies a credential of its
	// own when file is empty, so the tree is closed all the same.
	generated bool
}

func (o *zkAuthOptions) register(fs *flag.FlagSet, e *envDefaults) {
	fs.StringVar(&o.file, "zk-auth-file", env("ZK_AUTH_FILE", ""), "file holding the ZooKeeper digest credential user:password (mode 0600): the broker authenticates with it and creates every node writable by that identity only; empty: no authentication, nodes open to anyone ($QBROKER_ZK_AUTH_FILE)")
	fs.BoolVar(&o.worldRead, "zk-world-read", e.bool("ZK_WORLD_READ", false), "with --zk-auth-file, let any ZooKeeper client read (not change) the broker's nodes ($QBROKER_ZK_WORLD_READ)")
	fs.BoolVar(&o.migrate, "zk-migrate-acl", e.bool("ZK_MIGRATE_ACL", false), "with --zk-auth-file, give an existing tree open to anyone the brokers' ACL at start instead of refusing it ($QBROKER_ZK_MIGRATE_ACL)")
}

// validate checks that the flags that need a credential have one, and
// refuses to leave the tree under root open to every ZooKeeper client
// unless insecure (--insecure) says so.
func (o *zkAuthOptions) validate(root string, insecure bool) error {
	if o.file == "" && (o.worldRead || o.migrate) {
		return errors.New("--zk-world-read and --zk-migrate-acl need --zk-auth-file")
	}
	if o.file == "" && !o.generated && !insecure {
		return fmt.Errorf("without --zk-auth-file every node under ZooKeeper root %s would be writable by anyone who can reach ZooKeeper "+
			"(read payloads, delete or inject messages, delete queues): give --zk-auth-file with a digest credential user:password (mode 0600; see docs/security.md), "+
			"or --insecure to run with open nodes", root)
	}
	return nil
}

// logExposure warns, at every start, when the broker's nodes are open.
func (o *zkAuthOptions) logExposure(log *slog.Logger, root string) {
	if o.file == "" {
		log.Warn("INSECURE: no --zk-auth-file: every ZooKeeper client can read and change the broker's nodes", "root", root)
	}
}

// digest reads the credential; "" without --zk-auth-file.
func (o *zkAuthOptions) digest() (string, error) {
	if o.file == "" {
		return "", nil
	}
	return zkutil.ReadDigestFile(o.file)
}

// devAuthFile is the credential `qbroker dev` generates in its ZooKeeper
// directory, so that a development broker's tree is closed too.
const devAuthFile = "qbroker-zk-auth"

// ensureDevAuth returns the path of the development credential in dir,
// writing a new random one (mode 0600) the first time.
func ensureDevAuth(dir string) (string, error) {
	p := filepath.Join(dir, devAuthFile)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return "", err
	}
	cred := "qbroker:" + base64.RawURLEncoding.EncodeToString(secret) + "\n"
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("dev zk credential: %w", err)
	}
	if _, err := f.WriteString(cred); err != nil {
		f.Close()
		return "", fmt.Errorf("dev zk credential: %w", err)
	}
	return p, f.Close()
}
