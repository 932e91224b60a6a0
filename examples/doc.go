// Package examples holds programs that use qbroker's recipes as a library,
// each in a module of its own as a Go user's program would be, and the
// tests that build and run them against a real ZooKeeper.
//
//	outside/   a module that requires the released go-zookeeper and
//	           qbroker (replaced with this checkout): a FIFO queue, a lock
//	           and an election (TestOutsideModule)
package examples
