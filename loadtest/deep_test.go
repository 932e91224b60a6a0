package main

import (
	"os"
	"strings"
	"testing"
)

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tqbroker\nVmPeak:\t 1300000 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n"
	if got, err := parseVmHWM(strings.NewReader(status)); err != nil || got != 51234<<10 {
		t.Fatalf("got %d, %v; want %d", got, err, 51234<<10)
	}
	for _, bad := range []string{"Name:\tx\n", "VmHWM:\t12 MB\n", "VmHWM:\tmany kB\n"} {
		if _, err := parseVmHWM(strings.NewReader(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
	// This process has a peak.
	if n, err := procPeakRSS(os.Getpid()); err != nil || n < 1<<20 {
		t.Fatalf("own peak RSS: %d, %v", n, err)
	}
}
