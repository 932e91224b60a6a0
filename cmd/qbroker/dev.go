package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/qbroker/qbroker/internal/zkserver"
)

func init() {
	register(command{name: "dev", usage: "start a local ZooKeeper, then serve (what 'make run' runs)", run: func(args []string) error {
		fs := flag.NewFlagSet("dev", flag.ContinueOnError)
		fs.SetOutput(&helpWriter{out: os.Stdout, err: os.Stderr})
		o := serveFlags(fs)
		dir := fs.String("zk-dir", "", "ZooKeeper data directory; default a temporary one, removed on exit")
		secure := fs.String("secure-dir", "", "serve with TLS, client certificates and tokens from this directory, made on first use: a CA, certificates, a token for identity admin, a rules file")
		heap := fs.Int("zk-heap", zkserver.DefaultHeapMB, "ZooKeeper's heap (-Xmx) in MiB; --zk-data-budget defaults to a quarter of it")
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), "usage: qbroker dev [flags]\n\nStarts a local ZooKeeper (the installed one: Debian's zookeeper package or\n$ZOOKEEPER_HOME) on a free 127.0.0.1 port, then runs 'qbroker serve' against it.\nZooKeeper's output goes to zookeeper.log in its data directory. Stopping\nqbroker stops ZooKeeper; ZooKeeper dying stops qbroker, with an error.\n\nUnless --zk-auth-file is given, the broker authenticates to ZooKeeper with a\ncredential generated in the data directory (qbroker-zk-auth) and closes its nodes.\nThe ports are bound before ZooKeeper starts; Go profiles (--pprof) are on.\n\nflags (as for serve; --zk is ignored):")
			fs.PrintDefaults()
		}
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if *secure != "" {
			if err := devSecurity(*secure, o, os.Stderr); err != nil {
				return err
			}
		}
		o.zkAuth.generated = true // a credential of its own unless --zk-auth-file (below)
		if err := o.validate(); err != nil {
			return err
		}
		if *heap < 64 {
			return usageError{fmt.Errorf("--zk-heap %d: want at least 64 (MiB)", *heap)}
		}
		if !flagSet(fs, "pprof") && os.Getenv("QBROKER_PPROF") == "" {
			o.pprof = true // profiles on in development; serve needs --pprof
		}
		if !flagSet(fs, "zk-data-budget") && os.Getenv("QBROKER_ZK_DATA_BUDGET") == "" {
			o.zkDataBudget = int(zkserver.DataBudget(*heap) >> 20)
		}
		log, err := newLogger(o.logFormat, o.logLevel)
		if err != nil {
			return err
		}
		// The ports first: one in use fails at once, not after
		// ZooKeeper's start.
		if o.bound.lis, o.bound.metrics, err = o.listeners(); err != nil {
			return err
		}
		defer o.bound.close() // served and closed by then, unless the start failed
		sctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		startCtx, cancel := context.WithTimeout(sctx, 60*time.Second)
		zk, err := zkserver.Start(startCtx, zkserver.Config{Dir: *dir, HeapMB: *heap})
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "ZooKeeper running at %s (data in %s, log in %s; heap %d MiB, data budget %d MiB)\n",
			zk.Addr(), zk.Dir(), zk.LogPath(), *heap, o.zkDataBudget)
		o.zk = zk.Addr()
		if o.zkAuth.file == "" {
			// Closed by default: a credential of its own, kept with the
			// data so that a later `dev --zk-dir` finds it.
			if o.zkAuth.file, err = ensureDevAuth(zk.Dir()); err != nil {
				_ = zk.Close()
				return err
			}
			fmt.Fprintf(os.Stderr, "ZooKeeper digest credential in %s (zkCli: addauth digest <its content>)\n", o.zkAuth.file)
		}
		err = devServe(sctx, o, zk, log, os.Stderr)
		if errors.Is(err, errZKExited) {
			_ = zk.Stop() // keep the directory: its log tells why
			return err
		}
		_ = zk.Close()
		return err
	}})
}

// errZKExited reports that the development ZooKeeper died under the
// broker.
var errZKExited = errors.New("ZooKeeper exited")

// devServe serves until ctx ends or ZooKeeper's process dies. A death is
// reported loudly: an error log with the exit status and the log's path,
// the log's last lines on stderr, and an error return (a non-zero exit).
func devServe(ctx context.Context, o *serveOptions, zk *zkserver.Server, log *slog.Logger, stderr io.Writer) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-zk.Exited():
			cancel(fmt.Errorf("%w (%v); its log is %s", errZKExited, zk.ExitError(), zk.LogPath()))
		case <-ctx.Done():
		}
	}()
	err := serveCtx(ctx, o, log)
	cancel(nil)
	<-watched
	if cause := context.Cause(ctx); errors.Is(cause, errZKExited) {
		log.Error("ZooKeeper exited: the broker stopped", "status", fmt.Sprint(zk.ExitError()), "log", zk.LogPath())
		if tail, terr := zk.LogTail(20); terr == nil {
			fmt.Fprintf(stderr, "last lines of %s:\n  %s\n", zk.LogPath(), strings.Join(tail, "\n  "))
		}
		return cause
	}
	return err
}

// boundListeners are serve's ports, bound by dev before it starts
// ZooKeeper; nil: serve binds them.
type boundListeners struct {
	lis, metrics net.Listener
}

func (b boundListeners) close() {
	if b.lis != nil {
		b.lis.Close()
	}
	if b.metrics != nil {
		b.metrics.Close()
	}
}

// flagSet reports whether the command line set the named flag.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
