package connlimit

import (
	"fmt"
	"syscall"
)

// RaiseFileLimit raises the process's soft limit of open files
// (RLIMIT_NOFILE) to its hard limit and returns the new soft limit. (The
// Go runtime does the same at startup on Linux; doing it explicitly makes
// the limit the broker sizes itself by the one in force.)
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("connlimit: getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, fmt.Errorf("connlimit: setrlimit: %w", err)
		}
		lim = raised
	}
	return lim.Cur, nil
}

// FileLimit returns the process's soft limit of open files.
func FileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("connlimit: getrlimit: %w", err)
	}
	return lim.Cur, nil
}

// maxDefault caps DefaultMax when the file limit is unlimited or huge:
// every connection also costs the server about 64 KiB of buffers.
const maxDefault = 100_000

// DefaultMax is the connection bound for a process whose soft file limit
// is limit: the limit less a headroom of a tenth (at least 128 files) for
// everything else the process opens: its ZooKeeper sessions, the metrics
// listener and its scrapes, log files. At least 16, at most 100,000.
func DefaultMax(limit uint64) int {
	headroom := max(limit/10, 128)
	if limit <= headroom+16 {
		return 16
	}
	return int(min(limit-headroom, maxDefault))
}
