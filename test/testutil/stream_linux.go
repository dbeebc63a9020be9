package testutil

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// StreamChecked sends size bytes over one TCP connection from dialer (in
// namespace dial) to a listener at listenAddr in namespace listen, or back
// from the listener to the dialer if toDialer, and checks every byte: the
// stream is 8-byte offsets counting up, so a byte out of place, lost or
// repeated shows. It returns the Gbit/s the receiver saw.
func StreamChecked(tb testing.TB, listen, dial *NS, listenAddr string, size int64, toDialer bool) float64 {
	tb.Helper()
	ln := listen.Listen(tb, "tcp", listenAddr)
	defer ln.Close()
	var dialConn net.Conn
	if err := dial.Do(func() (err error) {
		dialConn, err = net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	defer dialConn.Close()
	accepted, err := ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	defer accepted.Close()
	from, to := dialConn, accepted
	if toDialer {
		from, to = accepted, dialConn
	}
	go func() {
		io.CopyN(from, &countingStream{}, size)
		from.(*net.TCPConn).CloseWrite()
	}()
	start := time.Now()
	to.SetReadDeadline(start.Add(60 * time.Second))
	var want countingStream
	got, exp := make([]byte, 64<<10), make([]byte, 64<<10)
	var n int64
	for {
		k, err := to.Read(got)
		if k > 0 {
			want.Read(exp[:k])
			if !bytes.Equal(got[:k], exp[:k]) {
				tb.Fatalf("stream to %s: bytes %d to %d differ from what was sent", listenAddr, n, n+int64(k))
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("stream to %s: after %d bytes: %v", listenAddr, n, err)
		}
	}
	if n != size {
		tb.Fatalf("stream to %s: received %d bytes, want %d", listenAddr, n, size)
	}
	return float64(n) * 8 / time.Since(start).Seconds() / 1e9
}

// countingStream reads as the 8-byte big-endian offsets of a stream, in
// turn.
type countingStream struct{ off int64 }

func (c *countingStream) Read(p []byte) (int, error) {
	var w [8]byte
	for i := range p {
		at := c.off + int64(i)
		binary.BigEndian.PutUint64(w[:], uint64(at/8))
		p[i] = w[at%8]
	}
	c.off += int64(len(p))
	return len(p), nil
}
