package election

// SetWaitingHook makes f run whenever a candidate starts waiting for its
// predecessor, until the returned func resets it. Set it while no
// Campaign runs.
func SetWaitingHook(f func(key, pred string)) (reset func()) {
	testHookWaiting = f
	return func() { testHookWaiting = nil }
}

// Predecessor and Lowest expose the ordering of candidate names.
func Predecessor(children []string, mine int32) (string, bool) { return predecessor(children, mine) }
func Lowest(children []string) string                          { return lowest(children) }
