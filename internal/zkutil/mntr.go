package zkutil

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// DataSize is what one ZooKeeper server reports of its data tree in mntr.
type DataSize struct {
	Bytes  int64 // zk_approximate_data_size: every node's path and data
	Znodes int64 // zk_znode_count
}

// maxMntr bounds the answer read: mntr answers a few KiB.
const maxMntr = 1 << 20

// Mntr asks the ZooKeeper server at addr (host:port, its client port) for
// its data size with the mntr four-letter word. The server must list mntr
// in 4lw.commands.whitelist; one that does not answers a text that Mntr
// returns in its error.
func Mntr(ctx context.Context, addr string) (DataSize, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return DataSize{}, fmt.Errorf("mntr %s: %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if _, err := conn.Write([]byte("mntr")); err != nil {
		return DataSize{}, fmt.Errorf("mntr %s: %w", addr, err)
	}
	out, err := io.ReadAll(io.LimitReader(conn, maxMntr))
	if err != nil {
		return DataSize{}, fmt.Errorf("mntr %s: %w", addr, err)
	}
	return parseMntr(addr, string(out))
}

func parseMntr(addr, out string) (DataSize, error) {
	var ds DataSize
	seen := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		var dst *int64
		switch f[0] {
		case "zk_approximate_data_size":
			dst, seen = &ds.Bytes, seen|1
		case "zk_znode_count":
			dst, seen = &ds.Znodes, seen|2
		default:
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return DataSize{}, fmt.Errorf("mntr %s: %s: %w", addr, f[0], err)
		}
		*dst = n
	}
	if seen != 3 {
		text := strings.TrimSpace(out)
		if len(text) > 200 {
			text = text[:200]
		}
		return DataSize{}, fmt.Errorf("mntr %s: no data size in the answer %q (is mntr in the server's 4lw.commands.whitelist?)", addr, text)
	}
	return ds, nil
}
