package zktest

// ServerAddr returns the address of the server Main started for this test
// package, and false when none is running (ZooKeeper not installed, or it
// failed to start). Examples, which get no testing.TB, connect with it.
func ServerAddr() (string, bool) {
	if server == nil {
		return "", false
	}
	return server.Addr(), true
}
