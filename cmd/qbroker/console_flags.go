package main

import (
	"strings"

	"github.com/qbroker/qbroker/internal/console"
)

// hostList is --console-host: the host names the web console answers to
// besides localhost, loopback addresses and its listen address. The flag
// repeats and takes comma-separated lists; given, it replaces
// $QBROKER_CONSOLE_HOSTS.
type hostList struct {
	names   []string
	fromEnv bool
}

func (h *hostList) String() string {
	if h == nil {
		return ""
	}
	return strings.Join(h.names, ",")
}

func (h *hostList) Set(v string) error {
	if h.fromEnv {
		h.names, h.fromEnv = nil, false
	}
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if err := console.CheckHost(n); err != nil {
			return err
		}
		h.names = append(h.names, n)
	}
	return nil
}

// consoleHosts reads $QBROKER_CONSOLE_HOSTS; a bad value is reported
// by e.err.
func consoleHosts(e *envDefaults) hostList {
	var h hostList
	if v, ok := e.lookup("CONSOLE_HOSTS"); ok && strings.TrimSpace(v) != "" {
		if err := h.Set(v); err != nil {
			e.bad("CONSOLE_HOSTS", v, "comma-separated host names, each optionally with :port ("+err.Error()+")")
			return hostList{}
		}
		h.fromEnv = true
	}
	return h
}
