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

// TestBrowser drives headless Chromium through the console against a
// real broker: create a queue, publish, see the count change, make a dead
// letter, redrive it, see the counts; a screenshot at each step is
// checked (a real, non-blank image) and so is the page's text.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	e := start(t, nil)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // the test may run as root
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()

	dirs := []string{t.TempDir()}
	if d := os.Getenv(shotsEnv); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	step := 0
	// shot takes a screenshot, checks it and keeps it, then checks that
	// the element sel's text holds every want.
	shot := func(name, sel string, want ...string) {
		t.Helper()
		step++
		buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("step %d %s: screenshot: %v", step, name, err)
		}
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("step %d %s: text of %s: %v", step, name, sel, err)
		}
		checkShot(t, name, buf)
		for _, d := range dirs {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("%02d-%s.png", step, name)), buf, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Fatalf("step %d %s: %s says %q, want %q in it", step, name, sel, text, w)
			}
		}
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// waitText waits until the element sel's text holds want: after a
	// form's submission, the next page has loaded. The evaluation fails
	// while the page changes (its context is gone): it is tried again.
	waitText := func(sel, want string) chromedp.Action[chromedp.Void] {
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

	run("open the console", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	shot("no-queues", "main", "Queues", "No queues yet.", "Create a queue")

	run("create a queue",
		chromedp.SendKeys(chromedp.CSS(`#create input[name="name"]`), "jobs"),
		chromedp.SendKeys(chromedp.CSS(`#create input[name="max_deliveries"]`), "1"),
		chromedp.Click(chromedp.CSS(`#create input[name="dead_letter"]`)),
		chromedp.Click(chromedp.CSS(`#create button`)),
		waitText("#flash", "Queue created."))
	shot("created", "main", "Queue created.", "jobs", "Ready\n0", "1, then dead-lettered")

	run("publish",
		chromedp.SendKeys(chromedp.CSS(`#publish textarea`), "hello from the browser"),
		chromedp.Click(chromedp.CSS(`#publish button`)),
		waitText("#flash", "Published message"))
	shot("published", "#stats", "Ready\n1", "Dead\n0")

	run("list the queues", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	shot("queues", "#queues tbody", "jobs", "fifo")
	ready, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#queues tbody td.ready`)))
	if err != nil || ready != "1" {
		t.Fatalf("the list shows ready %q (%v), want 1", ready, err)
	}

	deadLetter(t, e.grpc, "jobs")
	run("open the queue", chromedp.Click(chromedp.CSS(`#queues a[href="/console/queues/jobs"]`)),
		waitText("#qname", "jobs"))
	shot("dead-letter", "main", "Dead\n1", "Ready\n0", "hello from the browser", "Redrive all")

	run("redrive",
		chromedp.Click(chromedp.CSS(`#deadletters button`)),
		waitText("#flash", "Moved 1 dead letter(s)"))
	shot("redriven", "main", "Dead\n0", "Ready\n1", "No dead letters.")
	if st := e.stats(t, "jobs"); st.GetReady() != 1 || st.GetDead() != 0 {
		t.Fatalf("after the redrive: ready %d, dead %d; want 1, 0", st.GetReady(), st.GetDead())
	}

	run("brokers", chromedp.Navigate(e.srv.URL+"/console/brokers"), waitText("#brokers", "leader"))
	shot("brokers", "#brokers", e.b.ID(), "this broker", "leader")

	// The browser sent a real form at every step: the queue holds the
	// message as typed.
	resp, err := e.grpc.Receive(context.Background(), &pb.ReceiveRequest{Queue: "jobs", MaxMessages: 1})
	if err != nil || len(resp.GetMessages()) != 1 || string(resp.GetMessages()[0].GetPayload()) != "hello from the browser" {
		t.Fatalf("Receive: %v, %v; want the published message", resp, err)
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
