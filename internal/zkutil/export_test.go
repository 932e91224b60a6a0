package zkutil

// SetListedHook sets the hook DeleteTree runs after listing a node's
// children; nil removes it.
func SetListedHook(f func(p string)) { testHookListed = f }

// State returns what the Keeper knows of e: the session owning the node
// it made, and whether an outcome is unknown.
func (e *Kept) State() (owner int64, unknown bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.owner, e.unknown
}
