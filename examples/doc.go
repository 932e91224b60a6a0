// Package examples holds programs that use qbroker's recipes as a library,
// each in a module of its own as a Go user's program would be, and the
// tests that build and run them against a real ZooKeeper.
//
//	outside/   a module that requires the released go-zookeeper and
//	           qbroker (replaced with this checkout): a FIFO queue, a lock
//	           and an election (TestOutsideModule)
//	fencing/   a consumer whose effect is a row in a SQLite table (pure-Go
//	           driver), written only with a fencing token greater than
//	           the row's: a consumer paused past its lease has its write
//	           refused (TestFencingModule; docs/fencing.md)
package examples
