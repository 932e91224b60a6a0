package counter

// SetMaxVersion makes v the value nodes' highest version until the
// returned func restores it. Set it while no operation runs.
func SetMaxVersion(v int32) (restore func()) {
	old := maxVersion
	maxVersion = v
	return func() { maxVersion = old }
}

// ParseName exposes the epoch of a value node's name.
func ParseName(name string) (uint64, bool) { return parseName(name) }
