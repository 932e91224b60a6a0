package main

import (
	"context"
	"fmt"
	"strconv"
)

func runCounter(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("counter", "[flags] get|add|cas|set name [number...]", `
Reads or changes the counter name, a 64-bit signed integer of the
brokers' Counter service (0 until first written):
	counter get NAME          prints its value
	counter add NAME DELTA    adds DELTA (negative subtracts), prints the new value
	counter cas NAME OLD NEW  sets it to NEW if it is OLD; prints true or false,
	                          and exits with status 1 when it was not OLD
	counter set NAME VALUE    sets it, prints the value it replaced
Flags go before the numbers (a negative number ends the flags).

An add, cas or set whose answer is lost (the broker or the connection
failed: "unavailable") may or may not have been applied; running it again
may apply it twice. To change a counter exactly once, get its value, then
cas from that value; after a lost answer, get again: the same value means
the cas was not applied.`, std)
	pos, err := parse(fs, numbersAfterFlags(args), 2, 4)
	if err != nil {
		return err
	}
	verb, name, nums := pos[0], pos[1], pos[2:]
	want := map[string]int{"get": 0, "add": 1, "cas": 2, "set": 1}
	n, ok := want[verb]
	if !ok {
		return usagef("%q: want get, add, cas or set", verb)
	}
	if len(nums) != n {
		return usagef("counter %s takes %d number(s) after the name, got %d", verb, n, len(nums))
	}
	vals := make([]int64, n)
	for i, s := range nums {
		if vals[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return usagef("%q: want a 64-bit integer", s)
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	cnt := c.Counter(name)
	var v int64
	switch verb {
	case "get":
		v, err = cnt.Get(ctx)
	case "add":
		v, err = cnt.Add(ctx, vals[0])
	case "set":
		v, err = cnt.Set(ctx, vals[0])
	case "cas":
		swapped, err := cnt.CompareAndSet(ctx, vals[0], vals[1])
		if err != nil {
			return err
		}
		fmt.Fprintln(std.out, swapped)
		if !swapped {
			return exitStatus{1}
		}
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(std.out, v)
	return nil
}

// numbersAfterFlags ends the flags ("--") before the first argument that
// is a negative integer, which the flag package would take for a flag.
func numbersAfterFlags(args []string) []string {
	for i, a := range args {
		if a == "--" {
			break
		}
		if len(a) > 1 && a[0] == '-' {
			if _, err := strconv.ParseInt(a, 10, 64); err == nil {
				return append(append(append([]string{}, args[:i]...), "--"), args[i:]...)
			}
		}
	}
	return args
}
