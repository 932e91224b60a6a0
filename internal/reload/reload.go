// Package reload keeps a value built from files up to date: certificates,
// the tokens file, the rules file. A Value checks its files' modification
// times and sizes at most once per interval, on use, and rebuilds the value
// when one changed. There is no goroutine to own: the check runs on the
// caller of Get (a TLS handshake, a call's interceptor).
//
// A rebuild that fails keeps the previous value (a file half-written by an
// editor must not take the service down) and is logged once per change.
package reload

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Value looks at its files.
const DefaultInterval = time.Second

// Value is T built from files. It is safe for concurrent use.
type Value[T any] struct {
	paths    []string
	build    func() (T, error)
	interval time.Duration
	log      *slog.Logger

	cur     atomic.Pointer[version[T]]
	checked atomic.Int64 // unix nanoseconds of the last look at the files

	mu     sync.Mutex // held by the one caller checking the files
	stamps []stamp    // of the files the current value (or the last failure) was built from
}

// version is a value and its generation: the number of values built
// until it, 1 for New's.
type version[T any] struct {
	v   T
	gen uint64
}

// stamp identifies one version of a file.
type stamp struct {
	mod  time.Time
	size int64
	err  string // a stat error: a file that is missing counts as a version
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{err: err.Error()}
	}
	return stamp{mod: fi.ModTime(), size: fi.Size()}
}

// New builds the value once (an error is returned as is) and returns a
// Value that rebuilds it when one of paths changes. interval 0 means
// DefaultInterval; log nil discards.
func New[T any](build func() (T, error), interval time.Duration, log *slog.Logger, paths ...string) (*Value[T], error) {
	if len(paths) == 0 {
		return nil, errors.New("reload: no files")
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	v := &Value[T]{paths: paths, build: build, interval: interval, log: log}
	v.stamps = v.look()
	t, err := build()
	if err != nil {
		return nil, err
	}
	v.cur.Store(&version[T]{v: t, gen: 1})
	v.checked.Store(time.Now().UnixNano())
	return v, nil
}

func (v *Value[T]) look() []stamp {
	s := make([]stamp, len(v.paths))
	for i, p := range v.paths {
		s[i] = stampOf(p)
	}
	return s
}

// Get returns the current value, rebuilding it first when the interval
// has passed since the last look and a file changed.
func (v *Value[T]) Get() T {
	t, _ := v.GetVersion()
	return t
}

// GetVersion is Get, with the value's generation (see Generation).
func (v *Value[T]) GetVersion() (T, uint64) {
	now := time.Now().UnixNano()
	if now-v.checked.Load() >= int64(v.interval) && v.mu.TryLock() {
		v.refresh(now)
		v.mu.Unlock()
	}
	c := v.cur.Load()
	return c.v, c.gen
}

// Generation counts the values built so far (1 after New): it grows with
// every reload that succeeded, so a caller that remembers it learns that
// the value changed. It does not look at the files; Get does.
func (v *Value[T]) Generation() uint64 { return v.cur.Load().gen }

// refresh rebuilds the value if a file changed; the caller holds mu.
func (v *Value[T]) refresh(now int64) {
	v.checked.Store(now)
	s := v.look()
	same := true
	for i := range s {
		if s[i] != v.stamps[i] {
			same = false
		}
	}
	if same {
		return
	}
	v.stamps = s
	t, err := v.build()
	if err != nil {
		v.log.Warn("reload failed: keeping the previous version", "files", v.paths, "err", err)
		return
	}
	v.cur.Store(&version[T]{v: t, gen: v.cur.Load().gen + 1}) // under mu: the only writer
	v.log.Info("reloaded", "files", v.paths)
}
