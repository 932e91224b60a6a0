package console

import (
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// queuePath is a queue's page.
func queuePath(name string) string { return Prefix + "queues/" + url.PathEscape(name) }

var funcs = template.FuncMap{
	"queuePath": queuePath,
	"age": func(d *durationpb.Duration) string {
		if d == nil || d.AsDuration() <= 0 {
			return "-"
		}
		return d.AsDuration().Round(time.Second).String()
	},
	"kind": kindName,
	"set":  func(d *durationpb.Duration) bool { return d.AsDuration() > 0 },
	"rate": formatRate,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
}

func kindName(k pb.QueueKind) string {
	switch k {
	case pb.QueueKind_QUEUE_KIND_FIFO:
		return "fifo"
	case pb.QueueKind_QUEUE_KIND_PRIORITY:
		return "priority"
	case pb.QueueKind_QUEUE_KIND_SYNC:
		return "sync"
	}
	return k.String()
}

// queueRow is one line of the queues page.
type queueRow struct {
	Info  *pb.QueueInfo
	Stats *pb.QueueStats
	Err   string // Stats failed: why
	Rate  rate
}

type queuesData struct {
	Rows    []queueRow
	Next    string // page token of the next page
	Rates   bool   // the console has rates
	Pending bool   // but no sample to compare with yet
	Window  string // the rates' window
}

// pageSize is how many queues one page lists (each is a Stats call).
const pageSize = 100

func (c *Console) queuesPage(w http.ResponseWriter, r *http.Request) {
	resp, err := c.call(r, pb.Queue_ListQueues_FullMethodName,
		&pb.ListQueuesRequest{PageSize: pageSize, PageToken: r.URL.Query().Get("after")})
	if err != nil {
		c.fail(w, r, Prefix+"brokers", err)
		return
	}
	list := resp.(*pb.ListQueuesResponse)
	d := queuesData{Next: list.GetNextPageToken()}
	var rs map[string]rate
	if c.rates != nil {
		var window time.Duration
		rs, window = c.rates.read()
		d.Rates, d.Pending = true, window <= 0
		d.Window = window.Round(time.Second).String()
	}
	for _, q := range list.GetQueues() {
		row := queueRow{Info: q, Rate: rs[q.GetName()]}
		st, err := c.call(r, pb.Queue_Stats_FullMethodName, &pb.StatsRequest{Name: q.GetName()})
		if err != nil {
			row.Err = err.Error()
		} else {
			row.Stats = st.(*pb.QueueStats)
		}
		d.Rows = append(d.Rows, row)
	}
	c.render(w, http.StatusOK, "queues", c.newPage(w, r, "Queues", "queues", d))
}

// deadLetter is a listed message (a dead letter, or a ready one at the
// head) as the queue page shows it.
type deadLetter struct {
	ID          string
	Priority    uint32
	Published   time.Time
	Count       uint32
	Payload     string
	Note        string // binary, truncated
	ContentType string
	Headers     []string // "key: value", by key
}

func listed(m *pb.Message) deadLetter {
	text, note := showPayload(m.GetPayload())
	d := deadLetter{ID: m.GetId(), Priority: m.GetPriority(), Published: m.GetPublishedAt().AsTime(),
		Count: m.GetDeliveryCount(), Payload: text, Note: note, ContentType: m.GetContentType()}
	for _, k := range slices.Sorted(maps.Keys(m.GetHeaders())) {
		d.Headers = append(d.Headers, k+": "+m.GetHeaders()[k])
	}
	return d
}

// headSize is how many ready messages the queue page shows at a time.
const headSize = 20

type queueData struct {
	Info      *pb.QueueInfo
	Stats     *pb.QueueStats
	Dead      []deadLetter
	DeadErr   string // ListDeadLetters failed: why
	DeadNext  string
	Priority  bool
	Sync      bool
	DeadAfter string // the page token the dead letters start at
	Head      []deadLetter
	HeadErr   string // Browse failed: why
	HeadNext  string
	HeadAfter string // the page token the head starts at
	Charts    chartsData
}

// shownPayload is how much of a payload the page shows.
const shownPayload = 1024

func showPayload(p []byte) (text, note string) {
	if !utf8.Valid(p) {
		n := min(len(p), 64)
		return fmt.Sprintf("% x", p[:n]), fmt.Sprintf("binary, %d bytes", len(p))
	}
	if len(p) > shownPayload {
		cut := shownPayload
		for cut > 0 && !utf8.RuneStart(p[cut]) {
			cut--
		}
		return string(p[:cut]), fmt.Sprintf("first %d of %d bytes", cut, len(p))
	}
	return string(p), ""
}

func (c *Console) queuePage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	info, err := c.call(r, pb.Queue_GetQueue_FullMethodName, &pb.GetQueueRequest{Name: name})
	if err != nil {
		c.fail(w, r, Prefix, err)
		return
	}
	st, err := c.call(r, pb.Queue_Stats_FullMethodName, &pb.StatsRequest{Name: name})
	if err != nil {
		c.fail(w, r, Prefix, err)
		return
	}
	d := queueData{Info: info.(*pb.QueueInfo), Stats: st.(*pb.QueueStats), DeadAfter: r.URL.Query().Get("dead"),
		HeadAfter: r.URL.Query().Get("head")}
	d.Priority = d.Info.GetKind() == pb.QueueKind_QUEUE_KIND_PRIORITY
	d.Sync = d.Info.GetKind() == pb.QueueKind_QUEUE_KIND_SYNC
	if c.hist != nil {
		// Shown only to a caller the broker let read the queue (GetQueue
		// and Stats above).
		d.Charts = charts(c.hist.get(name))
	}
	head, err := c.call(r, pb.Queue_Browse_FullMethodName, &pb.BrowseRequest{Queue: name, Limit: headSize, PageToken: d.HeadAfter})
	if err != nil {
		d.HeadErr = err.Error()
	} else {
		l := head.(*pb.BrowseResponse)
		d.HeadNext = l.GetNextPageToken()
		for _, m := range l.GetMessages() {
			d.Head = append(d.Head, listed(m))
		}
	}
	dl, err := c.call(r, pb.Queue_ListDeadLetters_FullMethodName,
		&pb.ListDeadLettersRequest{Queue: name, Limit: pageSize, PageToken: d.DeadAfter})
	if err != nil {
		d.DeadErr = err.Error()
	} else {
		l := dl.(*pb.ListDeadLettersResponse)
		d.DeadNext = l.GetNextPageToken()
		for _, m := range l.GetMessages() {
			d.Dead = append(d.Dead, listed(m))
		}
	}
	c.render(w, http.StatusOK, "queue", c.newPage(w, r, "Queue "+name, "queues", d))
}

type brokersData struct {
	Self    string
	Health  string // "" when serving
	Members []memberRow
}

type memberRow struct {
	ID     string
	Since  time.Time
	Leader bool
	Self   bool
}

func (c *Console) brokersPage(w http.ResponseWriter, r *http.Request) {
	b := c.cfg.Broker
	d := brokersData{Self: b.ID()}
	if err := b.CheckHealth(); err != nil {
		d.Health = err.Error()
	}
	ms, err := b.Members(r.Context())
	if err != nil {
		c.fail(w, r, Prefix, err)
		return
	}
	for _, m := range ms {
		d.Members = append(d.Members, memberRow{ID: m.ID, Since: m.Since, Leader: m.Leader, Self: m.ID == d.Self})
	}
	c.render(w, http.StatusOK, "brokers", c.newPage(w, r, "Brokers", "brokers", d))
}

// Actions.

// formDuration reads an optional duration field; nil when empty.
func formDuration(r *http.Request, field, what, example string) (*durationpb.Duration, error) {
	v := strings.TrimSpace(r.PostForm.Get(field))
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, refuse(http.StatusBadRequest, "%s %q: want a duration such as %s; nothing was created", what, v, example)
	}
	return durationpb.New(d), nil
}

// formUint reads an optional non-negative integer field.
func formUint(r *http.Request, field string, bits int) (uint64, error) {
	v := strings.TrimSpace(r.PostForm.Get(field))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, bits)
	if err != nil {
		return 0, refuse(http.StatusBadRequest, "%s %q: want a whole number from 0 to %d", field, v, uint64(1)<<bits-1)
	}
	return n, nil
}

func (c *Console) create(r *http.Request) (string, error) {
	f := r.PostForm
	req := &pb.CreateQueueRequest{Name: strings.TrimSpace(f.Get("name")), DeadLetter: f.Get("dead_letter") != ""}
	switch f.Get("kind") {
	case "fifo", "":
		req.Kind = pb.QueueKind_QUEUE_KIND_FIFO
	case "priority":
		req.Kind = pb.QueueKind_QUEUE_KIND_PRIORITY
	case "sync":
		req.Kind = pb.QueueKind_QUEUE_KIND_SYNC
	default:
		return "", refuse(http.StatusBadRequest, "kind %q: want fifo, priority or sync", f.Get("kind"))
	}
	var err error
	if req.VisibilityTimeout, err = formDuration(r, "visibility_timeout", "visibility timeout", "30s"); err != nil {
		return "", err
	}
	if req.MessageTtl, err = formDuration(r, "message_ttl", "message TTL", "24h"); err != nil {
		return "", err
	}
	req.ExpireToDeadLetter = f.Get("expire_to_dead_letter") != ""
	req.Packed = f.Get("packed") != ""
	if req.DedupWindow, err = formDuration(r, "dedup_window", "dedup window", "5m"); err != nil {
		return "", err
	}
	members, err := formUint(r, "sync_members", 32)
	if err != nil {
		return "", err
	}
	maxDel, err := formUint(r, "max_deliveries", 32)
	if err != nil {
		return "", err
	}
	if req.MaxDepth, err = formUint(r, "max_depth", 64); err != nil {
		return "", err
	}
	if req.MaxBytes, err = formUint(r, "max_bytes", 64); err != nil {
		return "", err
	}
	req.SyncMembers, req.MaxDeliveries = uint32(members), uint32(maxDel)
	if _, err := c.call(r, pb.Queue_CreateQueue_FullMethodName, req); err != nil {
		return "", err
	}
	return queuePath(req.Name) + "?ok=created", nil
}

func (c *Console) publish(r *http.Request) (string, error) {
	name := r.PathValue("name")
	prio, err := formUint(r, "priority", 32)
	if err != nil {
		return "", err
	}
	// Browsers send a textarea's line ends as CRLF; publish what was typed.
	payload := strings.ReplaceAll(r.PostForm.Get("payload"), "\r\n", "\n")
	resp, err := c.call(r, pb.Queue_Publish_FullMethodName, &pb.PublishRequest{Queue: name,
		Messages: []*pb.OutMessage{{Payload: []byte(payload), Priority: uint32(prio)}}})
	if err != nil {
		return "", err
	}
	id := ""
	if ids := resp.(*pb.PublishResponse).GetIds(); len(ids) == 1 {
		id = ids[0]
	}
	return queuePath(name) + "?ok=published&id=" + url.QueryEscape(id), nil
}

// redrive moves back the dead letter the form names (field id), or all of
// them (field all).
func (c *Console) redrive(r *http.Request) (string, error) {
	name := r.PathValue("name")
	req := &pb.RedriveRequest{Queue: name}
	if r.PostForm.Get("all") == "" {
		id := r.PostForm.Get("id")
		if id == "" {
			return "", refuse(http.StatusBadRequest, "no dead letter named: redrive one (its id) or all")
		}
		req.Ids = []string{id}
	}
	resp, err := c.call(r, pb.Queue_Redrive_FullMethodName, req)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s?ok=redriven&n=%d", queuePath(name), resp.(*pb.RedriveResponse).GetRedriven()), nil
}

// confirmed refuses a purge or delete unless the form's confirm field
// repeats the queue's name.
func confirmed(r *http.Request, name, what string) error {
	if got := r.PostForm.Get("confirm"); got != name {
		return refuse(http.StatusBadRequest, "not confirmed: type the queue's name (%s) to %s it; nothing was changed", name, what)
	}
	return nil
}

func (c *Console) purge(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if err := confirmed(r, name, "purge"); err != nil {
		return "", err
	}
	resp, err := c.call(r, pb.Queue_Purge_FullMethodName, &pb.PurgeRequest{Name: name})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s?ok=purged&n=%d", queuePath(name), resp.(*pb.PurgeResponse).GetPurged()), nil
}

func (c *Console) deleteQueue(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if err := confirmed(r, name, "delete"); err != nil {
		return "", err
	}
	if _, err := c.call(r, pb.Queue_DeleteQueue_FullMethodName, &pb.DeleteQueueRequest{Name: name}); err != nil {
		return "", err
	}
	return Prefix + "?ok=deleted&q=" + url.QueryEscape(name), nil
}
