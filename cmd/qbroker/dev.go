package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), "usage: qbroker dev [flags]\n\nStarts a local ZooKeeper (the installed one: Debian's zookeeper package or\n$ZOOKEEPER_HOME) on a free 127.0.0.1 port, then runs 'qbroker serve' against it.\nStopping qbroker stops ZooKeeper.\n\nflags (as for serve; --zk is ignored):")
			fs.PrintDefaults()
		}
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if err := o.validate(); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		zk, err := zkserver.Start(startCtx, zkserver.Config{Dir: *dir})
		cancel()
		if err != nil {
			return err
		}
		defer zk.Close()
		fmt.Fprintf(os.Stderr, "ZooKeeper running at %s (data in %s)\n", zk.Addr(), zk.Dir())
		o.zk = zk.Addr()
		return serve(ctx, o)
	}})
}
