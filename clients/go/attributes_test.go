package qbroker_test

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Headers and a content type given with the publish options (or in a
// batch's OutMessage) come back on the delivered messages; bad ones are
// ErrInvalidArgument and publish nothing.
func TestPublishAttributes(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "attrs", qbroker.QueueOptions{})
	want := map[string]string{"a": "1", "b": "2", "c": "3"}
	if _, err := c.Publish(ctx, "attrs", []byte("one"), qbroker.WithHeaders(map[string]string{"a": "1", "b": "x"}),
		qbroker.WithHeader("b", "2"), qbroker.WithHeader("c", "3"), qbroker.WithContentType("text/plain")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishBatch(ctx, "attrs", []qbroker.OutMessage{
		{Payload: []byte("two"), Headers: want, ContentType: "text/plain"}, {Payload: []byte("plain")}}); err != nil {
		t.Fatal(err)
	}

	k, err := c.Consume(ctx, "attrs", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce})
	if err != nil {
		t.Fatal(err)
	}
	m := next(t, k)
	if !maps.Equal(m.Headers, want) || m.ContentType != "text/plain" {
		t.Fatalf("consumed %s: headers %v, content type %q; want %v, text/plain", m.Payload, m.Headers, m.ContentType, want)
	}
	if err := m.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Receive(ctx, "attrs", qbroker.ReceiveOptions{Max: 2})
	if err != nil || len(ms) != 2 {
		t.Fatalf("Receive: %d messages, %v", len(ms), err)
	}
	if !maps.Equal(ms[0].Headers, want) || ms[0].ContentType != "text/plain" || ms[1].Headers != nil || ms[1].ContentType != "" {
		t.Fatalf("received %+v, %+v", ms[0], ms[1])
	}

	tooMany := map[string]string{}
	for i := range 65 {
		tooMany[strconv.Itoa(i)] = ""
	}
	for name, opt := range map[string]qbroker.PublishOption{
		"65 headers":      qbroker.WithHeaders(tooMany),
		"non-UTF-8 value": qbroker.WithHeader("k", "\xff"),
		"non-UTF-8 key":   qbroker.WithHeader("\xff", "v"),
		"non-UTF-8 type":  qbroker.WithContentType("\xfe"),
		"empty key":       qbroker.WithHeader("", "v"),
	} {
		if _, err := c.Publish(ctx, "attrs", []byte("x"), opt); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if st, err := c.Stats(ctx, "attrs"); err != nil || st.Ready != 0 {
		t.Fatalf("after refused publishes: %+v, %v; want empty", st, err)
	}
}

// Browse pages through the ready messages without taking them.
func TestBrowse(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "br", qbroker.QueueOptions{})
	var want []string
	for i := range 7 {
		id, err := c.Publish(ctx, "br", []byte(strconv.Itoa(i)), qbroker.WithHeader("i", strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	var got []string
	token := ""
	for pages := 1; ; pages++ {
		ms, next, err := c.Browse(ctx, "br", token, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Headers["i"] != string(m.Payload) || m.DeliveryCount != 0 {
				t.Fatalf("browsed %+v", m)
			}
			if err := m.Ack(ctx); !errors.Is(err, qbroker.ErrNoLease) {
				t.Fatalf("Ack of a browsed message: got %v, want ErrNoLease", err)
			}
			got = append(got, m.ID)
		}
		if token = next; token == "" {
			break
		}
		if pages > 5 {
			t.Fatal("browse does not end")
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("browsed %v, want %v", got, want)
	}
	if st, err := c.Stats(ctx, "br"); err != nil || st.Ready != 7 {
		t.Fatalf("after browsing: %+v, %v", st, err)
	}
	if _, _, err := c.Browse(ctx, "br", "bad-token", 0); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("bad token: got %v, want ErrInvalidArgument", err)
	}
	if _, _, err := c.Browse(ctx, "missing", "", 0); !errors.Is(err, qbroker.ErrNotFound) {
		t.Fatalf("missing queue: got %v, want ErrNotFound", err)
	}
}
