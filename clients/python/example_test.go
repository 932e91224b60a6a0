// Package python_test runs the Python example client (example.py) against a
// real broker and ZooKeeper, and checks its work with the Go client.
package python_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/qbroker/qbroker/api/queuepb"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// python returns an interpreter that can import grpc: $PYTHON, else
// python3 on the PATH, else Debian's /usr/bin/python3 (where apt installs
// python3-grpcio, `make deps`). Without one the test skips, unless CI is
// set: then it fails.
func python(t *testing.T) string {
	t.Helper()
	candidates := []string{"python3", "/usr/bin/python3"}
	if p := os.Getenv("PYTHON"); p != "" {
		candidates = []string{p}
	}
	var tried []string
	for _, p := range candidates {
		out, err := exec.Command(p, "-c", "import grpc, google.protobuf").CombinedOutput()
		if err == nil {
			return p
		}
		tried = append(tried, fmt.Sprintf("%s: %v: %s", p, err, bytes.TrimSpace(out)))
	}
	msg := "Python gRPC is not importable (make deps installs python3-grpcio): " + strings.Join(tried, "; ")
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestStubsMatchProto checks that the committed Python stubs were
// generated from the api/queue.proto the Go stubs were (`make python`
// after `make generate`): their file descriptors are equal but for the
// file's name (api/queue.proto for Go, queue.proto for Python).
func TestStubsMatchProto(t *testing.T) {
	py := python(t)
	cmd := exec.Command(py, "-B", "-c",
		"import base64, queue_pb2; print(base64.b64encode(queue_pb2.DESCRIPTOR.serialized_pb).decode())")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reading queue_pb2's descriptor: %v\n%s", err, stderr.String())
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	pyFile := &descriptorpb.FileDescriptorProto{}
	if err := proto.Unmarshal(raw, pyFile); err != nil {
		t.Fatal(err)
	}
	goFile := protodesc.ToFileDescriptorProto(queuepb.File_api_queue_proto)
	goFile.Name = pyFile.Name
	clearJSONNames(pyFile.MessageType)
	clearJSONNames(goFile.MessageType)
	if !proto.Equal(pyFile, goFile) {
		t.Error("clients/python/queue_pb2.py does not match api/queuepb: run make python (and make generate)")
	}
}

// clearJSONNames drops the fields' json_name, which protoc hands to the
// Go generator but not to the Python one.
func clearJSONNames(msgs []*descriptorpb.DescriptorProto) {
	for _, m := range msgs {
		for _, f := range m.Field {
			f.JsonName = nil
		}
		clearJSONNames(m.NestedType)
	}
}

// startBroker serves a broker on a fresh root, with its metrics in reg,
// until the test ends.
func startBroker(t *testing.T, reg prometheus.Registerer) *brokertest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{
		ZooKeeper:      []string{zktest.Addr(t)},
		Root:           zktest.Root(t),
		SessionTimeout: 4 * time.Second,
		Registerer:     reg,
	}, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// runExample runs example.py with args and returns its exit status,
// stdout and stderr.
func runExample(t *testing.T, py string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"example.py"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok || ctx.Err() != nil {
			t.Fatalf("example.py %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

func TestPythonExample(t *testing.T) {
	py := python(t)
	reg := prometheus.NewRegistry()
	s := startBroker(t, reg)
	const queue, count = "py-example", 25

	code, out, errOut := runExample(t, py, "--addr", s.Addr, "--queue", queue,
		"--count", fmt.Sprint(count), "--prefix", "py", "--timeout", "60")
	if code != 0 {
		t.Fatalf("example.py exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	t.Logf("example.py:\n%s", out)

	// It printed every message it acked, in publish order.
	var acked []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "acked" {
			acked = append(acked, f[2])
			// At least once: each delivery has a fencing token.
			if len(f) < 5 || !strings.HasPrefix(f[4], "fencing_token=") || f[4] == "fencing_token=0" {
				t.Errorf("acked line %q: want a fencing_token other than 0", line)
			}
		}
	}
	if len(acked) != count {
		t.Fatalf("got %d acked lines, want %d", len(acked), count)
	}
	// The README shows ids of the form the broker gives.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	digits := regexp.MustCompile(`[0-9]`)
	shape := func(id string) string { return digits.ReplaceAllString(id, "0") }
	got := shape(strings.Fields(out[strings.Index(out, "acked "):])[1])
	for _, line := range strings.Split(string(readme), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "acked" && shape(f[1]) != got {
			t.Errorf("README.md shows message id %s, the broker gives ids like %s", f[1], strings.Fields(out[strings.Index(out, "acked "):])[1])
		}
	}
	for i, p := range acked {
		if want := fmt.Sprintf("py-%d", i); p != want {
			t.Errorf("acked[%d] = %q, want %q", i, p, want)
		}
	}

	// The broker saw count publishes, at-least-once deliveries and acks,
	// and nothing redelivered.
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"qbroker_messages_published_total", map[string]string{"queue": queue}, count},
		{"qbroker_messages_delivered_total", map[string]string{"queue": queue, "mode": "at_least_once"}, count},
		{"qbroker_messages_acked_total", map[string]string{"queue": queue}, count},
		{"qbroker_messages_redelivered_total", map[string]string{"queue": queue}, 0},
	} {
		if got := counter(t, reg, m.name, m.labels); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}

	// The Go client sees the queue empty, nothing in flight, no dead
	// letters and no consumer left.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := qbroker.Dial(ctx, s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.InFlight != 0 || st.Dead != 0 {
		t.Errorf("stats after the example: ready %d, in flight %d, dead %d; want all 0", st.Ready, st.InFlight, st.Dead)
	}
	zktest.WaitFor(t, 30*time.Second, "the example's Consume stream to be gone", func() bool {
		st, err := c.Stats(ctx, queue)
		return err == nil && st.Consumers == 0
	})
}

// counter returns the value of the counter name with labels in reg; 0 when
// the series does not exist (a counter never incremented).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestPythonExampleErrors checks that the example tells errors apart by
// their gRPC status code: a bad request ends it at once with
// InvalidArgument (exit status 2); no broker is Unavailable, retried, then
// exit status 1.
func TestPythonExampleErrors(t *testing.T) {
	py := python(t)
	s := startBroker(t, nil)

	code, out, errOut := runExample(t, py, "--addr", s.Addr, "--queue", "no/slashes", "--count", "1")
	if code != 2 || !strings.Contains(errOut, "INVALID_ARGUMENT") || strings.Contains(errOut, "retrying") {
		t.Errorf("bad queue name: exit %d, want 2 with INVALID_ARGUMENT and no retry\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	// A port nothing listens on: taken, then released.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	code, out, errOut = runExample(t, py, "--addr", addr, "--count", "1", "--timeout", "5")
	if code != 1 || !strings.Contains(errOut, "UNAVAILABLE") || !strings.Contains(errOut, "retrying") {
		t.Errorf("no broker: exit %d, want 1 with UNAVAILABLE after retries\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
