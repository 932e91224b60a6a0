package natsbridge

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Without the bridge, its metrics exist at 0: every event kind and drop
// reason, the connection gauge and the reconnect counter.
func TestRegisterDisabled(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := RegisterDisabled(reg); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			series[f.GetName()]++
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if v != 0 {
				t.Errorf("%s = %v, want 0", f.GetName(), v)
			}
		}
	}
	want := map[string]int{
		"qbroker_events_published_total": len(allKinds),
		"qbroker_events_dropped_total":   3,
		"qbroker_nats_connected":         1,
		"qbroker_nats_reconnects_total":  1,
	}
	for name, n := range want {
		if series[name] != n {
			t.Errorf("%s: %d series, want %d", name, series[name], n)
		}
	}
	if err := RegisterDisabled(reg); err == nil {
		t.Error("second RegisterDisabled on one registry succeeded")
	}
}
