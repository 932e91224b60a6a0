package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/qbroker/qbroker/internal/zkserver"
)

// zxidCounterSpan is how many transactions a leader's epoch holds: the
// low 32 bits of a zxid count them, and when they run out the leader
// gives up and the ensemble elects a leader again (ZOOKEEPER-2789), a
// pause in which no client request is served.
const zxidCounterSpan = 1 << 32

// ZKTxnStats is what ZooKeeper committed over a run, from its last zxid
// before and after: every transaction of the ensemble, the brokers' and
// any other client's.
type ZKTxnStats struct {
	Transactions int64 `json:"transactions"`
	// PerDelivered: transactions per message delivered (acked).
	PerDelivered float64 `json:"per_delivered"`
	// PerSec: over the whole run (publishing and delivering).
	PerSec float64 `json:"per_sec"`
	// DaysPerEpoch: how long the zxid counter of one leader lasts at
	// PerSec: 2^32 transactions, then a leader election.
	DaysPerEpoch float64 `json:"days_per_epoch"`
}

// readZxid asks the ZooKeeper server at addr (the first of a list) for
// its last zxid, with the srvr four-letter word.
func readZxid(addr string) (int64, error) {
	if i := strings.IndexByte(addr, ','); i >= 0 {
		addr = addr[:i]
	}
	out, err := zkserver.FourLetter(addr, "srvr", 2*time.Second)
	if err != nil {
		return 0, err
	}
	return parseZxid(out)
}

// parseZxid reads the "Zxid: 0x..." line of a srvr answer.
func parseZxid(srvr string) (int64, error) {
	for _, line := range strings.Split(srvr, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "Zxid:")
		if !ok {
			continue
		}
		v = strings.TrimPrefix(strings.TrimSpace(v), "0x")
		z, err := strconv.ParseUint(v, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("srvr: zxid %q: %v", v, err)
		}
		return int64(z), nil
	}
	return 0, fmt.Errorf("srvr: no zxid in %q (is srvr on the server's 4lw.commands.whitelist?)", srvr)
}

// zkTxnStats relates the zxids before and after a run of seconds to the
// messages delivered in it. ok is false when a leader election came in
// between (the epoch, the high 32 bits, changed: the counter restarted)
// or the figures are missing.
func zkTxnStats(z0, z1 int64, delivered int64, seconds float64) (ZKTxnStats, bool) {
	if z0>>32 != z1>>32 || z1 < z0 || seconds <= 0 {
		return ZKTxnStats{}, false
	}
	s := ZKTxnStats{Transactions: z1 - z0, PerSec: float64(z1-z0) / seconds}
	if delivered > 0 {
		s.PerDelivered = float64(s.Transactions) / float64(delivered)
	}
	if s.PerSec > 0 {
		s.DaysPerEpoch = zxidCounterSpan / s.PerSec / 86400
	}
	return s, true
}
