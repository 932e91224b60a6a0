package twophase_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/twophase"
)

// A coordinator asks two services to commit a transfer; each votes on its
// own session, as separate processes would, and all three learn the same
// outcome. The example connects to the ZooKeeper servers named by
// $QBROKER_ZK (host:port[,host:port...]); the package's tests set it to
// their own server.
func Example() {
	servers := strings.Split(os.Getenv("QBROKER_ZK"), ",")
	dial := func() *zk.Conn {
		conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			log.Fatal(err)
		}
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coordConn := dial()
	defer coordConn.Close()
	// One path per transaction, never reused.
	txPath := fmt.Sprintf("/examples/transfers/tx-%d", time.Now().UnixNano())

	coord, err := twophase.Begin(ctx, coordConn, txPath, twophase.Plan{Participants: []string{"ledger", "mailer"}, Timeout: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer coord.Close()

	names := []string{"ledger", "mailer"}
	var parts []*twophase.Tx
	for _, name := range names {
		conn := dial()
		defer conn.Close()
		p, err := twophase.Join(ctx, conn, txPath, name)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer p.Close()
		parts = append(parts, p)
	}
	// Each participant prepares its local work, then votes; it applies
	// the work only once the decision says commit.
	for _, p := range parts {
		if err := p.Vote(ctx, twophase.Commit); err != nil {
			fmt.Println(err)
			return
		}
	}
	for i, p := range parts {
		d, err := p.Wait(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(names[i], "learns: committed =", d.Committed)
	}
	d, err := coord.Wait(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("coordinator learns:", d.Reason)

	// Every participant applied the outcome: forget the transaction.
	if err := twophase.Delete(ctx, coordConn, txPath); err != nil {
		fmt.Println(err)
	}
	// Output:
	// ledger learns: committed = true
	// mailer learns: committed = true
	// coordinator learns: all voted commit
}
