package reload

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestValueFollowsFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	write := func(s string) {
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	write("one")
	build := func() (string, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(string(b), "bad") {
			return "", errors.New("bad content")
		}
		return string(b), nil
	}
	v, err := New(build, 10*time.Millisecond, nil, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Get(); got != "one" {
		t.Fatalf("got %q, want one", got)
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for v.Get() != want {
			if time.Now().After(deadline) {
				t.Fatalf("still %q after 20s, want %q", v.Get(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	gen := func(want uint64) {
		t.Helper()
		if got := v.Generation(); got != want {
			t.Fatalf("Generation: got %d, want %d", got, want)
		}
	}
	gen(1)
	write("two, longer")
	waitFor("two, longer")
	gen(2)
	write("bad!")
	// The bad version is read (its stamp recorded) and refused: the value
	// stays; then a good version replaces it.
	seen := func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.stamps[0].size == int64(len("bad!"))
	}
	deadline := time.Now().Add(20 * time.Second)
	for v.Get(); !seen(); v.Get() {
		if time.Now().After(deadline) {
			t.Fatal("the bad version was not read within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := v.Get(); got != "two, longer" {
		t.Fatalf("after a bad version: got %q, want the previous value", got)
	}
	gen(2)
	write("three")
	waitFor("three")
	gen(3)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(100 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := v.Get(); got != "three" {
			t.Fatalf("a removed file changed the value to %q", got)
		}
	}
	if _, err := New(build, 0, nil, p); err == nil {
		t.Fatal("New with a missing file: got no error")
	}
}
