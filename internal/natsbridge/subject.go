package natsbridge

import "github.com/qbroker/qbroker/internal/events"

// Subject returns the subject of an event for queue and kind under prefix:
// "<prefix>.<queue>.<kind>", where the queue and kind are each made one
// subject token by SubjectToken.
func Subject(prefix, queue string, kind events.Kind) string {
	return prefix + "." + SubjectToken(queue) + "." + SubjectToken(string(kind))
}

// EventSubject returns the subject of e under prefix: Subject's for
// queue events; "<prefix>.lock.<name>.<kind>",
// "<prefix>.election.<name>.<kind>", "<prefix>.counter.<name>.<kind>",
// "<prefix>.semaphore.<name>.<kind>", "<prefix>.barrier.<name>.<kind>" and
// "<prefix>.double_barrier.<name>.<kind>" for coordination events, one token
// longer than a queue's subjects so the two never meet.
func EventSubject(prefix string, e *events.Event) string {
	switch {
	case e.Lock != "":
		return prefix + ".lock." + SubjectToken(e.Lock) + "." + SubjectToken(string(e.Kind))
	case e.Election != "":
		return prefix + ".election." + SubjectToken(e.Election) + "." + SubjectToken(string(e.Kind))
	case e.Counter != "":
		return prefix + ".counter." + SubjectToken(e.Counter) + "." + SubjectToken(string(e.Kind))
	case e.Semaphore != "":
		return prefix + ".semaphore." + SubjectToken(e.Semaphore) + "." + SubjectToken(string(e.Kind))
	case e.Barrier != "":
		return prefix + ".barrier." + SubjectToken(e.Barrier) + "." + SubjectToken(string(e.Kind))
	case e.DoubleBarrier != "":
		return prefix + ".double_barrier." + SubjectToken(e.DoubleBarrier) + "." + SubjectToken(string(e.Kind))
	}
	return Subject(prefix, e.Queue, e.Kind)
}

// SubjectToken makes s a single NATS subject token, one to one: distinct
// strings give distinct tokens, so two queues never share a subject.
//
//   - '.' (which would split the token) becomes '~';
//   - '~', '%', the wildcards '*' and '>', whitespace and control bytes
//     become '%' and two upper-case hex digits ("%7E" for '~');
//   - the empty string becomes "%".
//
// Queue names ([A-Za-z0-9._-]) only ever have their dots replaced, so
// "orders.eu" is published as "orders~eu" and "orders_eu" as itself.
func SubjectToken(s string) string {
	if s == "" {
		return "%"
	}
	i := 0
	for i < len(s) && !escaped(s[i]) {
		i++
	}
	if i == len(s) {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+8)
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			b = append(b, '~')
		case escaped(c):
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// escaped reports whether SubjectToken replaces c.
func escaped(c byte) bool {
	switch c {
	case '.', '~', '%', '*', '>', ' ':
		return true
	}
	return c < 0x20 || c == 0x7f
}
