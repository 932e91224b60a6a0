package zkutil

// SetListedHook sets the hook DeleteTree runs after listing a node's
// children; nil removes it.
func SetListedHook(f func(p string)) { testHookListed = f }
