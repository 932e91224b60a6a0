// Package proccpu reads the CPU time Linux has charged a process, or one
// of its threads, from /proc.
package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports (procfs assumes the same).
const clockTicks = 100

// Process returns the user+system CPU time a process has used, from
// /proc/<pid>/stat (all its threads; not its waited-for children).
func Process(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseStat(string(b))
}

// ParseStat reads utime and stime (fields 14 and 15) of a stat line, of a
// process (/proc/<pid>/stat) or a thread (/proc/<pid>/task/<tid>/stat).
// The command name (field 2) is in parentheses and may contain spaces, so
// fields are counted after its closing parenthesis.
func ParseStat(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed stat %q: %v", stat, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
