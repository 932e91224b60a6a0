// Package errfmt formats the errors of qbroker's packages so that a
// package's prefix is said once: a package that wraps one of its own
// sentinels ("lock: not held") under an operation ("lock: unlock k: %w")
// would otherwise print "lock: unlock k: lock: not held".
package errfmt

import (
	"fmt"
	"strings"
)

// Errorf is fmt.Errorf for an error whose text starts with its package's
// prefix ("lock: ..."): wrapped errors stay what errors.Is and errors.As
// see, but the text drops the prefix where a wrapped error repeats it.
func Errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	msg := err.Error()
	pkg, rest, ok := strings.Cut(msg, ": ")
	if !ok || pkg == "" || strings.ContainsAny(pkg, " \t") {
		return err
	}
	once := pkg + ": " + strings.ReplaceAll(rest, ": "+pkg+": ", ": ")
	if once == msg {
		return err
	}
	return &prefixed{msg: once, err: err}
}

// prefixed is an Errorf error whose text was shortened.
type prefixed struct {
	msg string
	err error
}

func (e *prefixed) Error() string { return e.msg }
func (e *prefixed) Unwrap() error { return e.err }
