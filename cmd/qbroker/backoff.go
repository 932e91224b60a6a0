package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// backoffFlag is create's --retry-backoff: a list of increasing waits
// ("1s,5s,30s,5m"), or an exponential schedule ("exp:1s,2,5m": initial,
// multiplier, max; multiplier and max may be left out).
type backoffFlag struct{ o *qbroker.QueueOptions }

func (f backoffFlag) String() string {
	if f.o == nil || f.o.RetryBackoff == nil {
		return ""
	}
	return backoffString(f.o.RetryBackoff)
}

func (f backoffFlag) Set(s string) error {
	r := &qbroker.RetryBackoff{}
	if rest, ok := strings.CutPrefix(s, "exp:"); ok {
		parts := strings.Split(rest, ",")
		if len(parts) > 3 || parts[0] == "" {
			return fmt.Errorf("want exp:INITIAL[,MULTIPLIER[,MAX]], got %q", s)
		}
		var err error
		if r.Initial, err = time.ParseDuration(parts[0]); err != nil {
			return err
		}
		if len(parts) > 1 {
			if r.Multiplier, err = strconv.ParseFloat(parts[1], 64); err != nil {
				return fmt.Errorf("multiplier %q: %w", parts[1], err)
			}
		}
		if len(parts) > 2 {
			if r.Max, err = time.ParseDuration(parts[2]); err != nil {
				return err
			}
		}
	} else {
		for _, p := range strings.Split(s, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(p))
			if err != nil {
				return err
			}
			r.Steps = append(r.Steps, d)
		}
	}
	f.o.RetryBackoff = r
	return nil
}

// backoffString prints a schedule as --retry-backoff takes it.
func backoffString(r *qbroker.RetryBackoff) string {
	if r == nil {
		return "-"
	}
	if len(r.Steps) > 0 {
		s := make([]string, len(r.Steps))
		for i, d := range r.Steps {
			s[i] = d.String()
		}
		return strings.Join(s, ",")
	}
	return fmt.Sprintf("exp:%v,%v,%v", r.Initial, strconv.FormatFloat(r.Multiplier, 'g', -1, 64), r.Max)
}

// fenceField is the fencing token of an at-least-once delivery as
// consume prints it, after the payload and attributes; "" at most once.
func fenceField(m *qbroker.Message) string {
	if m.FencingToken == 0 {
		return ""
	}
	return "\tfencing-token=" + strconv.FormatUint(m.FencingToken, 10)
}
