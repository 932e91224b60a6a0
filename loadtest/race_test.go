//go:build race

package main

// raceEnabled: the test binary runs with the race detector, and so do the
// brokers the end-to-end test builds (their packages are then already
// compiled for the other packages' tests).
const raceEnabled = true
