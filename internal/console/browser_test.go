package console_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// shotsEnv names a directory the browser test also writes its
// screenshots to, to keep them.
const shotsEnv = "QBROKER_CONSOLE_SHOTS"

// chromium finds Debian's chromium (or another Chrome); missing, the test
// skips, or fails when CI is set.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is required in CI (make deps installs it: apt-get install chromium)")
	}
	t.Skip("chromium not installed (apt-get install chromium, or make deps): the browser test is skipped")
	return ""
}

// browser is a headless Chromium with a 1280x900 window, and the
// screenshots taken in it.
type browser struct {
	t    *testing.T
	ctx  context.Context
	dirs []string // where screenshots go
	step int
}

// newBrowser starts Chromium; it stops when the test ends.
func newBrowser(t *testing.T, exe string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // the test may run as root
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancel)

	b := &browser{t: t, ctx: ctx, dirs: []string{t.TempDir()}}
	if d := os.Getenv(shotsEnv); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		b.dirs = append(b.dirs, d)
	}
	return b
}

// shot takes a screenshot, checks it and keeps it, then checks that the
// element sel's text holds every want. It returns the screenshot (PNG).
func (b *browser) shot(name, sel string, want ...string) []byte {
	t := b.t
	t.Helper()
	b.step++
	buf, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("step %d %s: screenshot: %v", b.step, name, err)
	}
	text, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("step %d %s: text of %s: %v", b.step, name, sel, err)
	}
	checkShot(t, name, buf)
	for _, d := range b.dirs {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("%s-%02d-%s.png", t.Name(), b.step, name)), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Fatalf("step %d %s: %s says %q, want %q in it", b.step, name, sel, text, w)
		}
	}
	return buf
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// waitText waits until the element sel's text holds want: after a form's
// submission, the next page has loaded. The evaluation fails while the
// page changes (its context is gone): it is tried again.
func waitText(sel, want string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want)
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			ok, err := chromedp.Evaluate[bool](js)(ctx, tg)
			if err == nil && ok {
				return chromedp.Void{}, nil
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("%s never said %q (last error: %v)", sel, want, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// TestBrowser drives headless Chromium through the console against a
// real broker: create a queue, publish, see the count change, make a dead
// letter, redrive it, see the counts; a screenshot at each step is
// checked (a real, non-blank image) and so is the page's text.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	e := start(t, nil)
	b := newBrowser(t, exe)
	ctx := b.ctx

	b.run("open the console", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	b.shot("no-queues", "main", "Queues", "No queues yet.", "Create a queue")

	b.run("create a queue",
		chromedp.SendKeys(chromedp.CSS(`#create input[name="name"]`), "jobs"),
		chromedp.SendKeys(chromedp.CSS(`#create input[name="max_deliveries"]`), "1"),
		chromedp.Click(chromedp.CSS(`#create input[name="dead_letter"]`)),
		chromedp.Click(chromedp.CSS(`#create button`)),
		waitText("#flash", "Queue created."))
	b.shot("created", "main", "Queue created.", "jobs", "Ready\n0", "1, then dead-lettered")

	b.run("publish",
		chromedp.SendKeys(chromedp.CSS(`#publish textarea`), "hello from the browser"),
		chromedp.Click(chromedp.CSS(`#publish button`)),
		waitText("#flash", "Published message"))
	b.shot("published", "#stats", "Ready\n1", "Dead\n0")

	b.run("list the queues", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	b.shot("queues", "#queues tbody", "jobs", "fifo")
	ready, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#queues tbody td.ready`)))
	if err != nil || ready != "1" {
		t.Fatalf("the list shows ready %q (%v), want 1", ready, err)
	}

	deadLetter(t, e.grpc, "jobs")
	b.run("open the queue", chromedp.Click(chromedp.CSS(`#queues a[href="/console/queues/jobs"]`)),
		waitText("#qname", "jobs"))
	b.shot("dead-letter", "main", "Dead\n1", "Ready\n0", "hello from the browser", "Redrive all")

	b.run("redrive",
		chromedp.Click(chromedp.CSS(`#deadletters button`)),
		waitText("#flash", "Moved 1 dead letter(s)"))
	b.shot("redriven", "main", "Dead\n0", "Ready\n1", "No dead letters.")
	if st := e.stats(t, "jobs"); st.GetReady() != 1 || st.GetDead() != 0 {
		t.Fatalf("after the redrive: ready %d, dead %d; want 1, 0", st.GetReady(), st.GetDead())
	}

	b.run("brokers", chromedp.Navigate(e.srv.URL+"/console/brokers"), waitText("#brokers", "leader"))
	b.shot("brokers", "#brokers", e.b.ID(), "this broker", "leader")

	// The browser sent a real form at every step: the queue holds the
	// message as typed.
	resp, err := e.grpc.Receive(context.Background(), &pb.ReceiveRequest{Queue: "jobs", MaxMessages: 1})
	if err != nil || len(resp.GetMessages()) != 1 || string(resp.GetMessages()[0].GetPayload()) != "hello from the browser" {
		t.Fatalf("Receive: %v, %v; want the published message", resp, err)
	}
}

// box is an element's horizontal extent in CSS pixels.
type box struct {
	Left  float64 `json:"left"`
	Right float64 `json:"right"`
}

// layout is where a page put the elements a test looks at.
type layout struct {
	Viewport    float64 `json:"viewport"`    // the viewport's width
	ScrollWidth float64 `json:"scrollWidth"` // the page's, wider than the viewport when it overflows
	Found       bool    `json:"found"`
	Title       string  `json:"title"`
	Boxes       []box   `json:"boxes"`
}

// inViewport checks that the page does not overflow the viewport
// sideways and that every box lies within it.
func (l layout) inViewport(t *testing.T, what string, minBoxes int) {
	t.Helper()
	if !l.Found || len(l.Boxes) < minBoxes {
		t.Fatalf("%s: found %v, %d boxes; want at least %d", what, l.Found, len(l.Boxes), minBoxes)
	}
	if l.Viewport < 1200 || l.Viewport > 1280 {
		t.Fatalf("%s: the viewport is %v px wide, want about 1280", what, l.Viewport)
	}
	if l.ScrollWidth > l.Viewport {
		t.Fatalf("%s: the page is %v px wide, wider than the %v px viewport", what, l.ScrollWidth, l.Viewport)
	}
	for i, b := range l.Boxes {
		if b.Left < 0 || b.Right > l.Viewport {
			t.Fatalf("%s: box %d spans %v..%v px, outside the %v px viewport", what, i, b.Left, b.Right, l.Viewport)
		}
	}
}

// TestBrowserLongName: at 1280 px, the longest queue name (200
// characters) leaves every count of its row in the viewport (the name is
// cut short, whole in its title), and its queue page does not overflow
// sideways.
func TestBrowserLongName(t *testing.T) {
	exe := chromium(t)
	e := start(t, nil)
	name := strings.Repeat("orders.eu_", 20) // no hyphen: nothing a browser breaks a line at
	for _, q := range []string{name, "short"} {
		if _, err := e.grpc.CreateQueue(context.Background(), &pb.CreateQueueRequest{Name: q}); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, exe)

	b.run("open the console", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	b.shot("long-name-list", "#queues tbody", "short")
	list, err := chromedp.Run(b.ctx, chromedp.Evaluate[layout](fmt.Sprintf(`(() => {
		const d = document.documentElement;
		const row = [...document.querySelectorAll('#queues tbody tr')].find(r => {
			const n = r.querySelector('td.name'); return !!n && n.textContent.trim() === %q; });
		if (!row) return {viewport: d.clientWidth, scrollWidth: d.scrollWidth, found: false, title: '', boxes: []};
		const a = row.querySelector('td.name a');
		return {viewport: d.clientWidth, scrollWidth: d.scrollWidth, found: true, title: a ? a.title : '',
			boxes: [...row.querySelectorAll('td.num')].map(c => { const r = c.getBoundingClientRect(); return {left: r.left, right: r.right}; })};
	})()`, name)))
	if err != nil {
		t.Fatal(err)
	}
	list.inViewport(t, "the long name's row", 5)
	if list.Title != name {
		t.Fatalf("the long name's link has title %q, want the whole name", list.Title)
	}

	b.run("open the queue", chromedp.Navigate(e.srv.URL+"/console/queues/"+name), chromedp.WaitVisible(chromedp.CSS("#stats")))
	b.shot("long-name-queue", "#stats", "Ready\n0")
	page, err := chromedp.Run(b.ctx, chromedp.Evaluate[layout](`(() => {
		const d = document.documentElement;
		const q = document.querySelector('#qname');
		return {viewport: d.clientWidth, scrollWidth: d.scrollWidth, found: !!q, title: q ? q.textContent : '',
			boxes: [q, ...document.querySelectorAll('#stats > div, section.card')].filter(e => !!e).map(e => {
				const r = e.getBoundingClientRect(); return {left: r.left, right: r.right}; })};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	page.inViewport(t, "the long name's queue page", 6)
	if page.Title != name {
		t.Fatalf("the queue page names %q, want the whole name", page.Title)
	}
}

// checkShot decodes a screenshot and checks that it is a page, not a
// blank or broken image: a browser window's size, several distinct
// colours, and no single colour over 98% of it.
func checkShot(t *testing.T, name string, data []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	b := img.Bounds()
	if b.Dx() < 800 || b.Dy() < 600 {
		t.Fatalf("screenshot %s: %dx%d, want at least 800x600", name, b.Dx(), b.Dy())
	}
	counts := map[[4]uint32]int{}
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, a := img.At(x, y).RGBA()
			counts[[4]uint32{r >> 8, g >> 8, bl >> 8, a >> 8}]++
		}
	}
	total, top := 0, 0
	for _, n := range counts {
		total += n
		top = max(top, n)
	}
	if len(counts) < 16 || top*100 > total*98 {
		t.Fatalf("screenshot %s looks blank: %d colours, the commonest covers %d of %d pixels", name, len(counts), top, total)
	}
}
