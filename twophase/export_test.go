package twophase

// SetDecidedHook makes f run after every decision a Tx (or Vote, or Abort)
// creates, until the returned func resets it. Set it while no Tx runs.
func SetDecidedHook(f func(txPath string, d Decision)) (reset func()) {
	testHookDecided = f
	return func() { testHookDecided = nil }
}

// SetBeforeDecideHook makes f run in a Tx's goroutine after it read the
// votes and before it tries to create decision d, until the returned func
// resets it. Set it while no Tx runs.
func SetBeforeDecideHook(f func(txPath, by string, d Decision)) (reset func()) {
	testHookBeforeDecide = f
	return func() { testHookBeforeDecide = nil }
}
