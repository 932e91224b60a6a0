package faults_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// streamFlood holds HTTP/2 connections to a broker on which it opened
// Consume streams that never send a message (not even the subscribe
// request), as a misbehaving or hostile client would. It speaks just
// enough HTTP/2 to keep the connections up: it acknowledges the broker's
// settings and answers its pings. One goroutine per connection reads.
type streamFlood struct {
	conns   []net.Conn
	wg      sync.WaitGroup
	refused atomic.Int64 // streams the broker reset or ended

	mu      sync.Mutex
	reasons map[string]int // why streams were refused or ended
	done    map[streamID]bool
}

// ended records how the broker ended a stream (or, stream 0, the
// connection) and reports whether the stream was not counted before.
func (f *streamFlood) ended(c net.Conn, stream uint32, reason string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reasons == nil {
		f.reasons, f.done = map[string]int{}, map[streamID]bool{}
	}
	f.reasons[reason]++
	if id := (streamID{c, stream}); stream != 0 && !f.done[id] {
		f.done[id] = true
		f.refused.Add(1)
		return true
	}
	return false
}

type streamID struct {
	c  net.Conn
	id uint32
}

// why summarises how the broker refused or ended streams.
func (f *streamFlood) why() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.reasons)
}

// floodStreams opens perConn Consume streams on each of conns
// connections.
func floodStreams(addr string, conns, perConn int) (*streamFlood, error) {
	f := &streamFlood{}
	for range conns {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			f.release()
			return nil, err
		}
		f.conns = append(f.conns, c)
		if err := f.open(c, addr, perConn); err != nil {
			f.release()
			return nil, err
		}
	}
	return f, nil
}

func (f *streamFlood) open(c net.Conn, addr string, streams int) error {
	_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return err
	}
	var mu sync.Mutex // the Framer's writes
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		ended := 0 // streams of this connection the broker ended
		for {
			frame, err := fr.ReadFrame()
			if err != nil {
				// The broker (or release) closed the connection: its
				// streams are over.
				f.ended(c, 0, "connection closed")
				f.refused.Add(int64(max(streams-ended, 0)))
				return
			}
			mu.Lock()
			switch fm := frame.(type) {
			case *http2.SettingsFrame:
				if !fm.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !fm.IsAck() {
					_ = fr.WritePing(true, fm.Data)
				}
			case *http2.RSTStreamFrame:
				if f.ended(c, fm.StreamID, "RST_STREAM "+fm.ErrCode.String()) {
					ended++
				}
			case *http2.GoAwayFrame:
				f.ended(c, 0, fmt.Sprintf("GOAWAY %s %q", fm.ErrCode, fm.DebugData()))
			case *http2.MetaHeadersFrame:
				if fm.StreamEnded() {
					code, msg := "", ""
					for _, hf := range fm.Fields {
						switch hf.Name {
						case "grpc-status":
							code = hf.Value
						case "grpc-message":
							msg = hf.Value
						}
					}
					if f.ended(c, fm.StreamID, fmt.Sprintf("grpc-status %s %.50s", code, msg)) {
						ended++
					}
				}
			}
			mu.Unlock()
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range streams {
		hb.Reset()
		for _, h := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":path", "/qbroker.v1.Queue/Consume"},
			{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			_ = enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
		}
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("stream %d: %w", i, err)
		}
	}
	// From now on only ping and settings acks are written: no deadline,
	// so the connection stays up as long as the broker lets it.
	return c.SetWriteDeadline(time.Time{})
}

// release closes the connections and waits for their readers.
func (f *streamFlood) release() {
	for _, c := range f.conns {
		c.Close()
	}
	f.wg.Wait()
}

// halfOpen holds TCP connections to a broker that never send a byte.
type halfOpen struct {
	conns []net.Conn
}

// floodHalfOpen opens n connections; it stops early, without an error,
// when the kernel refuses more (the broker's backlog is full).
func floodHalfOpen(addr string, n int) (*halfOpen, error) {
	h := &halfOpen{}
	for range n {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && len(h.conns) > 0 {
				break
			}
			h.release()
			return nil, err
		}
		h.conns = append(h.conns, c)
	}
	return h, nil
}

func (h *halfOpen) release() {
	for _, c := range h.conns {
		c.Close()
	}
}

// garbage is what the suite writes to the gRPC port instead of HTTP/2.
// Each must make the broker close the connection.
var garbage = []struct {
	name string
	data []byte
}{
	{"random bytes", func() []byte {
		b := make([]byte, 4096)
		for i := range b {
			b[i] = byte(i*131 + 7)
		}
		return b
	}()},
	{"HTTP/1.1 request", []byte("GET /qbroker.v1.Queue/Stats HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")},
	{"TLS client hello", append([]byte{0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03}, make([]byte, 0xa5-6)...)},
	{"preface, then an oversized frame", append([]byte(http2.ClientPreface),
		0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00)},
	{"preface, then a malformed SETTINGS frame", append([]byte(http2.ClientPreface),
		0x00, 0x00, 0x05, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 1, 2, 3, 4, 5)},
	{"preface, then HEADERS with broken HPACK", append(append([]byte(http2.ClientPreface),
		0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // empty SETTINGS
		0x00, 0x00, 0x04, 0x01, 0x04, 0x00, 0x00, 0x00, 0x01), // HEADERS, END_HEADERS, stream 1
		0xff, 0xff, 0xff, 0xff)},
}

// sendGarbage writes data to addr and waits for the broker to close the
// connection; it fails when the connection is still open after within.
func sendGarbage(addr string, data []byte, within time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write(data); err != nil {
		return nil // closed while we wrote: fine
	}
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("connection still open after %v", within)
	}
	return nil // EOF or reset: the broker closed it
}
