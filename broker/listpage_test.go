package broker_test

import (
	"fmt"
	"path"
	"slices"
	"testing"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// ListQueues pages an identity allowed to view some queues through those
// queues alone: every visible queue exactly once, in order, full pages,
// and page tokens that are names it may view (the last one returned),
// never one of the queues hidden between them; no token once only hidden
// queues remain.
func TestListQueuesPagesHideNames(t *testing.T) {
	const rules = `admin   all   *
viewer  view  *.pub
`
	e := startClientEnv(t, rules)
	admin := pb.NewQueueClient(e.conn(t, "admin"))
	viewer := pb.NewQueueClient(e.conn(t, "viewer"))
	var all, visible []string
	for i := 1; i <= 13; i++ {
		kind := "sec"
		if i%3 == 1 && i < 13 { // hidden ones between the visible, and last
			kind = "pub"
		}
		name := fmt.Sprintf("n%02d.%s", i, kind)
		createQueue(t, admin, &pb.CreateQueueRequest{Name: name})
		all = append(all, name)
		if kind == "pub" {
			visible = append(visible, name)
		}
	}
	ctx := callCtx(t)
	list := func(c pb.QueueClient, size int, mayView func(string) bool) []string {
		t.Helper()
		var got []string
		token := ""
		for page := 0; ; page++ {
			if page > len(all) {
				t.Fatalf("page_size %d: more pages than queues", size)
			}
			r, err := c.ListQueues(ctx, &pb.ListQueuesRequest{PageSize: uint32(size), PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range r.GetQueues() {
				got = append(got, q.GetName())
			}
			token = r.GetNextPageToken()
			if token == "" {
				return got
			}
			if !mayView(token) {
				t.Fatalf("page_size %d, page %d: next_page_token %q names a queue the caller may not view", size, page, token)
			}
			if len(r.GetQueues()) != size {
				t.Fatalf("page_size %d, page %d: %d queues and a next page", size, page, len(r.GetQueues()))
			}
		}
	}
	isPub := func(n string) bool { ok, _ := path.Match("*.pub", n); return ok }
	for _, size := range []int{1, 2, 3, 4, 100} {
		if got := list(viewer, size, isPub); !slices.Equal(got, visible) {
			t.Fatalf("viewer, page_size %d: listed %v, want %v", size, got, visible)
		}
		if got := list(admin, size, func(string) bool { return true }); !slices.Equal(got, all) {
			t.Fatalf("admin, page_size %d: listed %v, want %v", size, got, all)
		}
	}
}
