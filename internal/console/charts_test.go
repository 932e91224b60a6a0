package console_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/console"
	"github.com/qbroker/qbroker/internal/zktest"
)

// reloadUntil loads url again and again until the expression js is
// true of the page: the charts are drawn by the server, so a page shows
// the samples taken before it loaded.
func reloadUntil(url, js, what string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		for {
			_, err := chromedp.Navigate(url)(ctx, tg)
			if err == nil {
				var ok bool
				if ok, err = chromedp.Evaluate[bool](js)(ctx, tg); err == nil && ok {
					return chromedp.Void{}, nil
				}
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("the page never showed %s (last error: %v)", what, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// chartBox is where the page drew one chart's SVG, and what the chart
// says of its data.
type chartBox struct {
	ID      string  `json:"id"`
	Left    float64 `json:"left"`
	Top     float64 `json:"top"`
	Right   float64 `json:"right"`
	Bottom  float64 `json:"bottom"`
	Points  int     `json:"points"`
	NonZero int     `json:"nonzero"`
	Line    string  `json:"line"`
	Stroke  string  `json:"stroke"` // the line's computed colour, rgb(r, g, b)
}

// work publishes pub messages to queue, receives got of them (at least
// once), acks all of them but nack, and nacks those (with max deliveries
// 1 and dead letters on, nacks dead-letter).
func work(t *testing.T, c pb.QueueClient, queue string, pub, got, nack int) {
	t.Helper()
	ctx := context.Background()
	msgs := make([]*pb.OutMessage, pub)
	for i := range msgs {
		msgs[i] = &pb.OutMessage{Payload: []byte(fmt.Sprintf("order %d", i))}
	}
	if _, err := c.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: msgs}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for got > 0 {
		resp, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: queue, MaxMessages: uint32(got), Wait: durationpb.New(10 * time.Second),
			Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE})
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, m := range resp.GetMessages() {
			if nack > 0 {
				nack--
				_, err = c.Nack(ctx, &pb.NackRequest{AckToken: m.GetAckToken()})
			} else {
				_, err = c.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
			}
			if err != nil {
				t.Fatalf("settle: %v", err)
			}
			got--
		}
	}
}

// TestBrowserCharts: a queue's page charts its publish, deliver, ack and
// dead-letter rates and its depth. Messages are published, received,
// acked and dead-lettered through a real broker in four rounds a few
// samples apart; headless Chromium reloads the queue page until every
// chart has non-zero data, then a screenshot shows the five charts, each
// with its line drawn above the zero line in its own colour.
func TestBrowserCharts(t *testing.T) {
	exe := chromium(t)
	e := startWith(t, nil, console.Config{ChartInterval: 200 * time.Millisecond},
		func(c *broker.Config) { c.StatsInterval = 200 * time.Millisecond })
	ctx := context.Background()
	if _, err := e.grpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "orders", Kind: pb.QueueKind_QUEUE_KIND_FIFO,
		MaxDeliveries: 1, DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, exe)
	url := e.srv.URL + "/console/queues/orders"
	points := func(n int) string {
		return fmt.Sprintf(`(() => { const f = document.getElementById('chart-publish'); return !!f && +f.dataset.points >= %d; })()`, n)
	}
	b.run("open the queue", reloadUntil(url, points(1), "a sample of the queue"))

	// Four rounds, each a few samples after the last.
	rounds := []struct{ pub, got, nack int }{{20, 10, 2}, {40, 30, 2}, {10, 15, 1}, {30, 10, 0}}
	for i, r := range rounds {
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`+document.getElementById('chart-publish').dataset.points`))
		if err != nil {
			t.Fatal(err)
		}
		work(t, e.grpc, "orders", r.pub, r.got, r.nack)
		b.run(fmt.Sprintf("round %d sampled", i+1), reloadUntil(url, points(n+3), fmt.Sprintf("%d samples", n+3)))
	}
	b.run("all charts with data", reloadUntil(url, `(() => ['publish', 'deliver', 'ack', 'dead', 'depth'].every(id => {
		const f = document.getElementById('chart-' + id); return !!f && +f.dataset.nonzero > 0; }))()`, "non-zero data in every chart"))
	if st := e.stats(t, "orders"); st.GetReady() != 35 || st.GetDead() != 5 {
		t.Fatalf("the queue: ready %d, dead %d; want 35, 5", st.GetReady(), st.GetDead())
	}
	b.run("charts in view", chromedp.ScrollIntoView(chromedp.CSS("#qname")))
	shot := b.shot("charts", "#charts", "Last 1m12s", "Published/s", "Delivered/s", "Acked/s", "Dead-lettered/s", "Depth (ready)")

	boxes, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]chartBox](`[...document.querySelectorAll('#charts figure.chart')].map(f => {
		const r = f.querySelector('svg').getBoundingClientRect(), line = f.querySelector('path.line');
		return {id: f.id, left: r.left, top: r.top, right: r.right, bottom: r.bottom, points: +f.dataset.points,
			nonzero: +f.dataset.nonzero, line: line.getAttribute('d'), stroke: getComputedStyle(line).stroke};
	})`))
	if err != nil {
		t.Fatal(err)
	}
	ratio, err := chromedp.Run(b.ctx, chromedp.Evaluate[float64](`window.devicePixelRatio`))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	if len(boxes) != 5 {
		t.Fatalf("%d charts, want 5: %+v", len(boxes), boxes)
	}
	for _, c := range boxes {
		if c.Points < 12 || c.NonZero == 0 || strings.Count(c.Line, "L") < 11 {
			t.Errorf("%s: %d points, %d above zero, line %q; want at least 12 points drawn, some above zero", c.ID, c.Points, c.NonZero, c.Line)
		}
		if c.Top < 0 || c.Bottom > 900 || c.Left < 0 || c.Right > 1280 || c.Right-c.Left < 100 {
			t.Errorf("%s: drawn at %v,%v..%v,%v, want at least 100 px wide within the 1280x900 viewport", c.ID, c.Left, c.Top, c.Right, c.Bottom)
			continue
		}
		var r, g, bl int
		if _, err := fmt.Sscanf(c.Stroke, "rgb(%d, %d, %d)", &r, &g, &bl); err != nil {
			t.Fatalf("%s: line colour %q: %v", c.ID, c.Stroke, err)
		}
		// The zero line is at 76 of the SVG's 90 units: count the pixels
		// of the line's colour above it.
		zero := c.Top + (c.Bottom-c.Top)*72/90
		above := colored(img, c.Left*ratio, c.Top*ratio, c.Right*ratio, zero*ratio, r, g, bl)
		if above < 5 {
			t.Errorf("%s: %d pixels of its line's colour %s above the zero line in the screenshot, want some", c.ID, above, c.Stroke)
		}
	}
}

// colored counts the pixels of img in the rectangle whose colour is
// near r, g, b.
func colored(img image.Image, x0, y0, x1, y1 float64, r, g, b int) int {
	n := 0
	for y := int(y0); y < int(y1); y++ {
		for x := int(x0); x < int(x1); x++ {
			pr, pg, pb, _ := img.At(x, y).RGBA()
			d := abs(int(pr>>8)-r) + abs(int(pg>>8)-g) + abs(int(pb>>8)-b)
			if d < 60 {
				n++
			}
		}
	}
	return n
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// TestQueueCharts: the queue page's charts, without a browser: the
// page carries the five charts with the samples of the queue's
// published messages, and a request with a foreign Host gets the
// refusal, not the charts.
func TestQueueCharts(t *testing.T) {
	e := startWith(t, nil, console.Config{ChartInterval: 50 * time.Millisecond})
	ctx := context.Background()
	if _, err := e.grpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", Kind: pb.QueueKind_QUEUE_KIND_FIFO}); err != nil {
		t.Fatal(err)
	}
	published := regexp.MustCompile(`id="chart-publish" data-points="(\d+)" data-nonzero="(\d+)"`)
	var body string
	zktest.WaitFor(t, 30*time.Second, "samples of q", func() bool {
		_, body = e.get(t, e.client, "/console/queues/q")
		m := published.FindStringSubmatch(body)
		return m != nil && m[1] != "0"
	})
	if _, err := e.grpc.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("a")}}}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "a publish rate in the chart", func() bool {
		_, body = e.get(t, e.client, "/console/queues/q")
		m := published.FindStringSubmatch(body)
		return m != nil && m[2] != "0"
	})
	mustContain(t, "queue page", body, `id="charts"`, "Last 18s", `id="chart-deliver"`, `id="chart-ack"`, `id="chart-dead"`,
		`id="chart-depth"`, `<path class="line" d="M`, "sampled every 50ms")

	code, body := e.do(t, e.client, "GET", "/console/queues/q", "rebind.attacker.example", nil)
	if code != http.StatusMisdirectedRequest || strings.Contains(body, "chart-") {
		t.Fatalf("foreign Host: %d, want 421 without the charts\n%s", code, body)
	}
}
