package natsbridge

import "github.com/qbroker/qbroker/internal/events"

// Subject returns the subject of an event for queue and kind under prefix:
// "<prefix>.<queue>.<kind>", where the queue and kind are each made one
// subject token by SubjectToken.
func Subject(prefix, queue string, kind events.Kind) string {
	return prefix + "." + SubjectToken(queue) + "." + SubjectToken(string(kind))
}

// SubjectToken makes s a single NATS subject token: '.' (which would split
// the token), the wildcards '*' and '>' and whitespace are replaced by '_';
// an empty s becomes "_". Queue names ([A-Za-z0-9._-]) only ever have their
// dots replaced, so "orders.eu" is published as "orders_eu". The mapping is
// not one to one ("a.b" and "a_b" share a token): the body's "queue" field
// has the exact name.
func SubjectToken(s string) string {
	if s == "" {
		return "_"
	}
	i := 0
	for i < len(s) && !badTokenByte(s[i]) {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if badTokenByte(b[i]) {
			b[i] = '_'
		}
	}
	return string(b)
}

func badTokenByte(c byte) bool {
	switch c {
	case '.', '*', '>', ' ', '\t', '\r', '\n', '\f', '\v':
		return true
	}
	return c < 0x20 || c == 0x7f
}
