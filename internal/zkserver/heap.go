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

// Heap is a server's heap after a full collection, by generation: the
// "used" figures of jcmd GC.heap_info, whose young and old generations'
// lines come first with the serial collector the servers run
// (-XX:+UseSerialGC).
type Heap struct {
	// Young: what the young generation holds when read, allocated since
	// the collection (the process runs on between the two jcmd calls: up
	// to tens of MB on a busy server).
	Young int64
	// Old: the tenured generation, where a full collection of the serial
	// collector compacts every live object: the live heap.
	Old int64
}

// Used is the heap the generations hold in all.
func (h Heap) Used() int64 { return h.Young + h.Old }

// LiveHeap forces a full collection of the Java process pid (jcmd GC.run)
// and reads its generations then (GC.heap_info). Errors: ErrNoJcmd.
func LiveHeap(ctx context.Context, pid int) (Heap, error) {
	if _, err := exec.LookPath("jcmd"); err != nil {
		return Heap{}, ErrNoJcmd
	}
	if out, err := exec.CommandContext(ctx, "jcmd", strconv.Itoa(pid), "GC.run").CombinedOutput(); err != nil {
		return Heap{}, fmt.Errorf("zkserver: jcmd %d GC.run: %v: %s", pid, err, out)
	}
	out, err := exec.CommandContext(ctx, "jcmd", strconv.Itoa(pid), "GC.heap_info").CombinedOutput()
	if err != nil {
		return Heap{}, fmt.Errorf("zkserver: jcmd %d GC.heap_info: %v: %s", pid, err, out)
	}
	// The young and old generations' lines come first; Metaspace's
	// "used" is not heap.
	m := usedRE.FindAllStringSubmatch(string(out), 2)
	if len(m) < 2 {
		return Heap{}, fmt.Errorf("zkserver: jcmd %d GC.heap_info: no generations in %q", pid, out)
	}
	young, _ := strconv.ParseInt(m[0][1], 10, 64)
	old, _ := strconv.ParseInt(m[1][1], 10, 64)
	return Heap{Young: young << 10, Old: old << 10}, nil
}
