package zkqueue

import "fmt"

// PackLimits bounds a pack (WithPacking): the messages one node holds.
// Zero fields take the defaults.
type PackLimits struct {
	// MaxCount is the most messages in one pack (default 1,000).
	MaxCount int
	// MaxBytes bounds a pack's data (default 256 KiB); a message larger
	// than that is a pack of its own.
	MaxBytes int
}

// Pack limit defaults.
const (
	DefaultPackCount = 1000
	DefaultPackBytes = 256 << 10
	maxPackCount     = 4095 // an index fits 3 hex digits (packName)
)

func (l *PackLimits) validate() error {
	if l.MaxCount == 0 {
		l.MaxCount = DefaultPackCount
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultPackBytes
	}
	if l.MaxCount < 1 || l.MaxCount > maxPackCount {
		return fmt.Errorf("zkqueue: pack count %d out of range [1, %d]", l.MaxCount, maxPackCount)
	}
	if l.MaxBytes < 1 || l.MaxBytes > HardMaxPayload {
		return fmt.Errorf("zkqueue: pack bytes %d out of range [1, %d]", l.MaxBytes, HardMaxPayload)
	}
	return nil
}

// WithPacking makes the queue store many messages per node (pack.go):
// the messages of one publish, and of the publishes a window gathers, go
// into one node.
func WithPacking(l PackLimits) Option { return func(o *options) { o.packing = &l } }
