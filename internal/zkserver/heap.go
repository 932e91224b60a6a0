package zkserver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
)

// ErrNoJcmd reports that jcmd, which reads a server's heap, is not on the
// PATH (it comes with a JDK, not with a JRE).
var ErrNoJcmd = errors.New("zkserver: jcmd (a JDK) is needed to read the heap")

var usedRE = regexp.MustCompile(`used (\d+)K`)

// LiveHeap returns the heap the Java process pid uses after a full
// collection: jcmd GC.run, then GC.heap_info (the generations' used
// sizes). Errors: ErrNoJcmd.
func LiveHeap(ctx context.Context, pid int) (int64, error) {
	if _, err := exec.LookPath("jcmd"); err != nil {
		return 0, ErrNoJcmd
	}
	if out, err := exec.CommandContext(ctx, "jcmd", strconv.Itoa(pid), "GC.run").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("zkserver: jcmd %d GC.run: %v: %s", pid, err, out)
	}
	out, err := exec.CommandContext(ctx, "jcmd", strconv.Itoa(pid), "GC.heap_info").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("zkserver: jcmd %d GC.heap_info: %v: %s", pid, err, out)
	}
	var kb int64
	// The young and old generations' lines come first; Metaspace's
	// "used" is not heap.
	for _, m := range usedRE.FindAllStringSubmatch(string(out), 2) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		kb += n
	}
	return kb << 10, nil
}
