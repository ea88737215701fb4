// Package mllp is the k6/x/mllp extension: one persistent MLLP connection per VU, one message in flight.
//
//	import mllp from "k6/x/mllp";
//	const c = mllp.connect("127.0.0.1:2575");     // optional 2nd argument: timeout in ms (default 10000)
//	const r = c.send(message);  // {ack, code, controlId, ms}: the ACK, MSA-1, MSA-2, round trip in ms
//	c.close();
package mllp

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"

	"go.k6.io/k6/js/modules"
)

func init() { modules.Register("k6/x/mllp", new(root)) }

type (
	root     struct{}
	instance struct{}
	// Client is one MLLP connection.
	Client struct {
		conn    net.Conn
		r       *bufio.Reader
		timeout time.Duration
	}
)

func (*root) NewModuleInstance(modules.VU) modules.Instance { return &instance{} }

func (m *instance) Exports() modules.Exports {
	return modules.Exports{Named: map[string]any{"connect": m.connect}}
}

// connect dials addr; the connection stays open across iterations (vu.Context() ends with each iteration, so
// it is not tied to it) until close() or the end of the process.
func (*instance) connect(addr string, timeoutMs int64) (*Client, error) {
	timeout := 10 * time.Second
	if timeoutMs > 0 {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &Client{conn, bufio.NewReader(conn), timeout}, nil
}

// Send frames message as 0x0B message 0x1C 0x0D, waits for one framed answer and parses its MSA.
func (c *Client) Send(message string) (map[string]any, error) {
	start := time.Now()
	_ = c.conn.SetDeadline(start.Add(c.timeout))
	if _, err := c.conn.Write([]byte("\x0b" + message + "\x1c\r")); err != nil {
		return nil, err
	}
	if _, err := c.r.ReadBytes(0x0b); err != nil { // bytes before the frame are skipped
		return nil, err
	}
	frame, err := c.r.ReadBytes(0x1c)
	if err != nil {
		return nil, err
	}
	if b, err := c.r.ReadByte(); err != nil || b != '\r' {
		return nil, fmt.Errorf("mllp: frame not ended by 0x1C 0x0D (%v)", err)
	}
	ms := float64(time.Since(start).Nanoseconds()) / 1e6
	ack := string(frame[:len(frame)-1])
	code, controlID := "", ""
	if len(ack) > 3 && strings.HasPrefix(ack, "MSH") {
		sep := ack[3:4]
		for _, seg := range strings.FieldsFunc(ack, func(r rune) bool { return r == '\r' || r == '\n' }) {
			if f := strings.Split(seg, sep); f[0] == "MSA" && len(f) > 1 {
				code = f[1]
				if len(f) > 2 {
					controlID = f[2]
				}
				break
			}
		}
	}
	return map[string]any{"ack": ack, "code": code, "controlId": controlID, "ms": ms}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
