package python_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// TestCoordStubsMatchProto checks that the committed coord_pb2.py was
// generated from the api/coord.proto the Go stubs were (make python after
// make generate).
func TestCoordStubsMatchProto(t *testing.T) {
	py := python(t)
	cmd := exec.Command(py, "-B", "-c",
		"import base64, coord_pb2; print(base64.b64encode(coord_pb2.DESCRIPTOR.serialized_pb).decode())")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reading coord_pb2's descriptor: %v\n%s", err, stderr.String())
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	pyFile := &descriptorpb.FileDescriptorProto{}
	if err := proto.Unmarshal(raw, pyFile); err != nil {
		t.Fatal(err)
	}
	goFile := protodesc.ToFileDescriptorProto(queuepb.File_api_coord_proto)
	goFile.Name = pyFile.Name
	clearJSONNames(pyFile.MessageType)
	clearJSONNames(goFile.MessageType)
	if !proto.Equal(pyFile, goFile) {
		t.Error("clients/python/coord_pb2.py does not match api/queuepb: run make python (and make generate)")
	}
}

// runScript runs a Python script of this directory with args and returns
// its exit status, stdout and stderr.
func runScript(t *testing.T, py, script string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"-B", script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && (!errors.As(err, &ee) || ctx.Err() != nil) {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", script, args, err, stdout.String(), stderr.String())
	}
	code := 0
	if ee != nil {
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// The coordination example's workers all enter the double barrier before
// any leaves, take the lock one at a time with growing tokens, and leave
// nothing behind in ZooKeeper; a bad name ends it with InvalidArgument
// (exit status 2).
func TestPythonCoordExample(t *testing.T) {
	py := python(t)
	root := zktest.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: root, SessionTimeout: 4 * time.Second},
		brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	const workers = 4
	code, out, errOut := runScript(t, py, "coord_example.py", "--addr", s.Addr, "--barrier", "py-step",
		"--lock", "py-lock", "--workers", strconv.Itoa(workers), "--timeout", "60")
	if code != 0 {
		t.Fatalf("coord_example.py exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	t.Logf("coord_example.py:\n%s", out)
	entered, left, lastToken := 0, 0, int64(0)
	var held string // the token of the lock line before, while held
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "worker" {
			continue
		}
		switch f[2] {
		case "entered":
			if left > 0 {
				t.Fatalf("%q after a worker left", line)
			}
			entered++
		case "left":
			if entered != workers {
				t.Fatalf("%q after %d of %d entered", line, entered, workers)
			}
			left++
		case "locked":
			tok, err := strconv.ParseInt(f[3], 10, 64)
			if held != "" || err != nil || tok <= lastToken {
				t.Fatalf("%q: held %q, last token %d; want one holder at a time, tokens growing", line, held, lastToken)
			}
			held, lastToken = f[3], tok
		case "unlocked":
			if f[3] != held {
				t.Fatalf("%q while %q held the lock", line, held)
			}
			held = ""
		}
	}
	if entered != workers || left != workers || lastToken == 0 {
		t.Fatalf("entered %d, left %d, last token %d; want %d, %d and a grant", entered, left, lastToken, workers, workers)
	}
	conn := zktest.Conn(t)
	if ok, _, err := conn.Exists(root + "/barriers/py-step"); err != nil || ok {
		t.Errorf("the barrier after the example: exists %v, %v; want removed", ok, err)
	}
	for _, dir := range []string{"/doublebarriers/py-step", "/locks/py-lock"} {
		kids, _, err := conn.Children(root + dir)
		if err != nil && !errors.Is(err, zk.ErrNoNode) || len(kids) != 0 {
			t.Errorf("%s after the example: %v, %v; want nothing", dir, kids, err)
		}
	}

	code, _, errOut = runScript(t, py, "coord_example.py", "--addr", s.Addr, "--barrier", "no/slashes")
	if code != 2 || !strings.Contains(errOut, "INVALID_ARGUMENT") {
		t.Fatalf("a bad barrier name: exit %d, stderr %q; want 2 and INVALID_ARGUMENT", code, errOut)
	}
}
