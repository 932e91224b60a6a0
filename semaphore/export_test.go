package semaphore

// SetWaitingHook makes f run whenever a waiter starts waiting: for the
// waiter pred before it, or, first in line, for the leases (pred ""),
// until the returned func resets it. Set it while no Acquire runs.
func SetWaitingHook(f func(key, pred string)) (reset func()) {
	testHookWaiting = f
	return func() { testHookWaiting = nil }
}

// SetWokenHook makes f run whenever a waiter wakes from its watches, with
// what it waited for (as SetWaitingHook's pred), until the returned func
// resets it. Set it while no Acquire runs.
func SetWokenHook(f func(key, pred string)) (reset func()) {
	testHookWoken = f
	return func() { testHookWoken = nil }
}
