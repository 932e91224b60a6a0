package main

import (
	"fmt"
	"strconv"
	"strings"
)

// weightFlag collects create's --fairness-weight key=n flags.
type weightFlag map[string]int

func (w weightFlag) String() string { return "" }

func (w weightFlag) Set(v string) error {
	k, n, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=weight, got %q", v)
	}
	x, err := strconv.Atoi(n)
	if err != nil || x < 1 || x > 100 {
		return fmt.Errorf("weight %q of %q: want 1..100", n, k)
	}
	w[k] = x
	return nil
}
