package ops

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/bpf"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// CaptureOptions are `vmnetctl capture`'s: the VM, its network if it has
// several, when the capture ends (0: when interrupted), and where the
// pcapng and the closing line go.
type CaptureOptions struct {
	VM, Network string
	Count       int
	Duration    time.Duration
	// Filter is a capture filter expression ("" for every frame).
	Filter string
	// Ring, if set, makes the capture a flight recorder of that many
	// bytes (nettypes.CaptureOptions.Ring).
	Ring     int
	Out, Err io.Writer
}

// Capture copies the frames of a VM's port, as the controller captures
// them (GET /v1/capture), to o.Out as pcapng, then says on o.Err how many
// frames it wrote and how many the kernel dropped (the reader was slower
// than the VM).
func Capture(ctx context.Context, sd statedir.Dir, o CaptureOptions) error {
	q := url.Values{"vm": {o.VM}}
	if o.Network != "" {
		q.Set("network", o.Network)
	}
	if o.Count > 0 {
		q.Set("count", strconv.Itoa(o.Count))
	}
	if o.Duration > 0 {
		q.Set("duration", o.Duration.String())
	}
	if o.Ring > 0 {
		q.Set("ring", strconv.Itoa(o.Ring))
	}
	if o.Filter != "" {
		prog, err := CompileFilter(ctx, o.Filter)
		if err != nil {
			return err
		}
		q.Set("filter", ctlapi.EncodeFilter(prog))
	}
	cl := NewClient(sd)
	if !cl.Running(ctx) {
		return fmt.Errorf("no controller runs for %s: nothing is attached to capture", sd.Path)
	}
	reqCtx, hc := ctx, cl.http
	var conn atomic.Pointer[net.UnixConn]
	if o.Ring > 0 {
		// A flight recorder interrupted writes what it holds: the
		// request outlives ctx, and when ctx ends the connection's
		// write side is closed, which ends the controller's request
		// (its server reads EOF): the recorder then writes its ring and
		// the answer ends as it would have.
		reqCtx = context.WithoutCancel(ctx)
		path := sd.APISocket()
		hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, "unix", path)
				if uc, ok := c.(*net.UnixConn); ok {
					conn.Store(uc)
				}
				return c, err
			}}}
	}
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, "http://vmnetctl/v1/capture?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return AccessHint(fmt.Errorf("controller API: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s", strings.TrimRight(string(msg), "\r\n"))
	}
	if o.Ring > 0 {
		fmt.Fprintf(o.Err, "capture of %s: recording the last %s of its frames\n", o.VM, api.FormatBytes(uint64(o.Ring)))
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-ctx.Done():
				fmt.Fprintf(o.Err, "capture of %s: interrupted; writing what the recorder holds\n", o.VM)
				if c := conn.Load(); c != nil {
					c.CloseWrite()
				}
			case <-done:
			}
		}()
	}
	count := &frameCounter{w: o.Out}
	if _, err := io.Copy(count, resp.Body); err != nil && ctx.Err() == nil {
		return err
	}
	if t := resp.Trailer.Get(ctlapi.CaptureTrailer); t != "" {
		fmt.Fprintf(o.Err, "capture of %s: %s\n", o.VM, t)
		if _, failed, ok := strings.Cut(t, "; "); ok {
			return fmt.Errorf("capture of %s: %s", o.VM, failed)
		}
	} else {
		// Interrupted: the controller's count (and the kernel's drops) did
		// not come; the frames written are counted here.
		fmt.Fprintf(o.Err, "capture of %s: frames=%d (interrupted)\n", o.VM, count.frames)
	}
	return nil
}

// maxFilterExpr bounds a filter expression (libpcap's compiler is fast,
// but its input is the user's).
const maxFilterExpr = 4096

// CompileFilter compiles a capture filter (tcpdump's and Wireshark's
// syntax: `icmp`, `tcp port 443 and host 10.0.0.5`) to classic BPF for
// Ethernet frames with `tcpdump -ddd`: libpcap's own compiler, run as the
// user, so the filter means what it means there.
func CompileFilter(ctx context.Context, expr string) ([]bpf.RawInstruction, error) {
	if len(expr) > maxFilterExpr {
		return nil, fmt.Errorf("--filter is %d bytes; at most %d", len(expr), maxFilterExpr)
	}
	path, err := exec.LookPath("tcpdump")
	if err != nil {
		return nil, errors.New("--filter needs tcpdump, whose libpcap compiles it (apt install tcpdump; dnf install tcpdump)")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-ddd", "-y", "EN10MB", "--", expr)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimPrefix(strings.TrimSpace(stderr.String()), "tcpdump: ")
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("--filter %q: %s", expr, msg)
	}
	prog, err := ctlapi.DecodeFilter(strings.ReplaceAll(strings.TrimSpace(stdout.String()), "\n", ","))
	if err != nil {
		return nil, fmt.Errorf("--filter %q: tcpdump -ddd wrote what is no filter: %w", expr, err)
	}
	return prog, nil
}

// frameCounter counts the packet blocks of the pcapng stream written
// through it (little-endian, as the controller writes it).
type frameCounter struct {
	w      io.Writer
	hdr    [8]byte // a block's type and length, as far as read
	have   int
	skip   uint64 // what is left of the block
	frames uint64
}

func (c *frameCounter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	for p := b[:n]; len(p) > 0; {
		if c.skip > 0 {
			k := min(uint64(len(p)), c.skip)
			c.skip, p = c.skip-k, p[k:]
			continue
		}
		k := copy(c.hdr[c.have:], p)
		c.have, p = c.have+k, p[k:]
		if c.have == len(c.hdr) {
			if binary.LittleEndian.Uint32(c.hdr[0:]) == 6 { // an enhanced packet block
				c.frames++
			}
			c.skip, c.have = max(uint64(binary.LittleEndian.Uint32(c.hdr[4:])), 8)-8, 0
		}
	}
	return n, err
}
