package broker

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Actions a rule grants on names matching its patterns.
const (
	ActPublish = "publish" // Publish
	ActConsume = "consume" // Consume, Receive, Ack, Nack, ExtendLease, ListDeadLetters
	ActCreate  = "create"  // CreateQueue
	ActDelete  = "delete"  // DeleteQueue
	ActPurge   = "purge"   // Purge
	ActRedrive = "redrive" // Redrive
	ActJoin    = "join"    // JoinSync
	ActView    = "view"    // GetQueue, Stats, Browse, ListQueues (implied by every queue action)
	ActDebug   = "debug"   // the Go profiles of the metrics listener (name DebugName)
	// Lock; Unlock and Revoke of the caller's own locks.
	ActLock = "lock"
	// Unlock and Revoke of any lock, another identity's too.
	ActLockAdmin = "lock.admin"
	// Campaign; Proclaim and Resign of the caller's own candidates;
	// Leader, Observe.
	ActElection = "election"
	// Leader, Observe (implied by election and election.admin).
	ActElectionObserve = "election.observe"
	// Proclaim and Resign of any candidate, another identity's too.
	ActElectionAdmin = "election.admin"
	// Counter Add, CompareAndSet, Set; Get.
	ActCounter = "counter"
	// Counter Get (implied by counter).
	ActCounterRead = "counter.read"
	// Acquire; Release and Revoke of the caller's own semaphore leases.
	ActSemaphore = "semaphore"
	// Release and Revoke of any lease, another identity's too; SetLimit.
	ActSemaphoreAdmin = "semaphore.admin"
	// Barrier Wait; DoubleBarrier Enter.
	ActBarrier = "barrier"
	// Barrier Set and Remove (implies barrier).
	ActBarrierAdmin = "barrier.admin"
)

// Checks of calls that act on a lock or a candidate by key, before the
// broker knows whose it is: either action lets the call in, and the
// handler then needs the .admin one for another identity's node.
const (
	actLockByKey      = "lock (or lock.admin)"
	actElectionByKey  = "election (or election.admin)"
	actSemaphoreByKey = "semaphore (or semaphore.admin)"
)

// DebugName is the name an ActDebug rule's patterns must match.
const DebugName = "pprof"

// actionGroups are names standing for several actions in a rules file.
var actionGroups = map[string][]string{
	"admin": {ActCreate, ActDelete, ActPurge, ActRedrive, ActLockAdmin, ActElectionAdmin, ActSemaphoreAdmin, ActBarrierAdmin},
	"all": {ActPublish, ActConsume, ActCreate, ActDelete, ActPurge, ActRedrive, ActJoin, ActView, ActLock, ActLockAdmin,
		ActElection, ActElectionObserve, ActElectionAdmin, ActDebug, ActCounter, ActCounterRead, ActSemaphore, ActSemaphoreAdmin,
		ActBarrier, ActBarrierAdmin},
}

// queueActions are the actions on queues: each implies view.
var queueActions = []string{ActPublish, ActConsume, ActCreate, ActDelete, ActPurge, ActRedrive, ActJoin, ActView}

// impliedBy lists, for an action, the actions that grant it too.
var impliedBy = map[string][]string{
	ActView:            queueActions,
	ActElectionObserve: {ActElection, ActElectionAdmin},
	actLockByKey:       {ActLock, ActLockAdmin},
	actElectionByKey:   {ActElection, ActElectionAdmin},
	ActCounterRead:     {ActCounter},
	actSemaphoreByKey:  {ActSemaphore, ActSemaphoreAdmin},
	ActBarrier:         {ActBarrierAdmin},
}

// Rules are a parsed rules file.
type Rules struct {
	rules []rule
}

type rule struct {
	identity string // or "*": any authenticated identity
	actions  []string
	patterns []string // path.Match globs: orders.*, billing, *
}

func readRules(file string) (*Rules, error) { return readParsed(file, ParseRules) }

// ParseRules parses a rules file: one rule per line,
//
//	<identity> <action>[,<action>...] <pattern>[,<pattern>...]
//
// granting the actions on the queues (or locks, or elections) whose names
// match a pattern (a glob: * matches any run of characters, ? one, [a-z]
// a class). The identity * stands for any authenticated identity. Actions:
// publish, consume, create, delete, purge, redrive, join, view, lock,
// lock.admin, election, election.observe, election.admin, counter,
// counter.read, semaphore, semaphore.admin, barrier, barrier.admin, debug
// (the Go profiles, name pprof); admin is create, delete, purge, redrive,
// lock.admin, election.admin, semaphore.admin and barrier.admin; all is
// every action. Barrier names (double barriers' too) share the
// patterns' namespace with the others. Blank lines and
// lines starting with # are ignored. What no rule allows is denied.
func ParseRules(data []byte) (*Rules, error) {
	r := &Rules{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want \"<identity> <actions> <patterns>\"", n)
		}
		ru := rule{identity: f[0]}
		if f[0] != "*" {
			if err := checkIdentity(f[0]); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
		}
		for _, a := range strings.Split(f[1], ",") {
			if g, ok := actionGroups[a]; ok {
				ru.actions = append(ru.actions, g...)
			} else if slices.Contains(actionGroups["all"], a) {
				ru.actions = append(ru.actions, a)
			} else {
				return nil, fmt.Errorf("line %d: unknown action %q (want publish, consume, create, delete, purge, redrive, join, view, lock, lock.admin, election, election.observe, election.admin, counter, counter.read, semaphore, semaphore.admin, barrier, barrier.admin, debug, admin or all)", n, a)
			}
		}
		for _, p := range strings.Split(f[2], ",") {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				return nil, fmt.Errorf("line %d: bad pattern %q", n, p)
			}
			ru.patterns = append(ru.patterns, p)
		}
		r.rules = append(r.rules, ru)
	}
	return r, sc.Err()
}

// Allowed reports whether identity may do action on name.
func (r *Rules) Allowed(identity, action, name string) bool {
	for _, ru := range r.rules {
		if ru.identity != "*" && ru.identity != identity {
			continue
		}
		if !ru.grants(action) {
			continue
		}
		for _, p := range ru.patterns {
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
	}
	return false
}

func (ru rule) grants(action string) bool {
	if slices.Contains(ru.actions, action) {
		return true
	}
	for _, a := range ru.actions {
		if slices.Contains(impliedBy[action], a) {
			return true
		}
	}
	return false
}
