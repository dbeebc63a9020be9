package capture

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/nettypes"
	"github.com/vmnetctl/vmnetctl/rtlink"
)

// rcvBuf is the packet socket's receive buffer: what a slow reader may
// fall behind by before the kernel drops (and counts) frames, never the
// VM's.
const rcvBuf = 8 << 20

// maxFrame is the largest frame read: a port with offloads passes 64 KiB
// segments with their headers.
const maxFrame = 128 << 10

// pollEvery is how often a capture that waits for frames looks at its
// context and its duration.
const pollEvery = 200 * time.Millisecond

// Port copies the frames of link port, both ways, to w as pcapng: two
// interfaces named after o.Name, the first what the VM sent, the second
// what it was sent; only those that pass o.Filter, if it has one. It ends after o.Count frames, after o.Duration, or
// when ctx is done, and returns how many frames it wrote and how many
// the kernel dropped because w was slower than the VM. It writes every
// frame as it comes (a reader such as `wireshark -k -i -` sees them live).
func Port(ctx context.Context, port string, o nettypes.CaptureOptions, w io.Writer) (nettypes.CaptureStats, error) {
	var st nettypes.CaptureStats
	index, err := rtlink.Index(port)
	if err != nil {
		return st, fmt.Errorf("capturing on %s: %w", port, err)
	}
	// Protocol 0: the socket receives nothing until it is bound to the
	// port (with ETH_P_ALL it would queue every interface's frames from
	// its creation to its bind, and hand them over as the VM's).
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("capturing on %s: %w", port, err)
	}
	defer unix.Close(fd)
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	if len(o.Filter) > 0 {
		// Before the bind: no frame reaches the socket unfiltered.
		prog := make([]unix.SockFilter, len(o.Filter))
		for i, r := range o.Filter {
			prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
		}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
			return st, fmt.Errorf("capturing on %s: the kernel refuses the filter: %w", port, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: index}); err != nil {
		return st, fmt.Errorf("capturing on %s: %w", port, err)
	}
	if o.Bound != nil {
		o.Bound()
	}
	out := &output{w: w, name: o.Name, ring: o.Ring}
	if o.Ring == 0 {
		if err := out.start(); err != nil {
			return st, err
		}
	}
	var deadline time.Time
	if o.Duration > 0 {
		deadline = time.Now().Add(o.Duration)
	}
	buf := make([]byte, maxFrame)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for o.Count == 0 || st.Frames < uint64(o.Count) {
		if ctx.Err() != nil {
			st.Ended = "interrupted"
			break
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			break
		}
		if o.Until != nil {
			if why := o.Until(); why != "" {
				st.Ended = why
				break
			}
		}
		if n, err := unix.Poll(pfd, int(pollEvery/time.Millisecond)); err != nil && err != unix.EINTR {
			return st, err
		} else if n <= 0 {
			continue
		}
		n, from, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		if err != nil {
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err == unix.ENETDOWN || err == unix.ENXIO || err == unix.ENODEV {
				st.Ended = "the port went: its helper exited"
				break
			}
			return st, err
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Ifindex != index {
			continue // (none comes from elsewhere once bound; a guard)
		}
		iface := uint32(0) // from the VM
		if ll.Pkttype == unix.PACKET_OUTGOING {
			iface = 1 // the port sent it: to the VM
		}
		if err := out.frame(iface, time.Now(), buf[:min(n, len(buf))], n); err != nil {
			return st, err
		}
		st.Frames++
	}
	if ps, err := unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
		st.Dropped = uint64(ps.Drops)
	}
	if o.Ring > 0 {
		st.Frames = uint64(len(out.held))
	}
	return st, out.end(st.Dropped)
}

// output is where a capture's frames go: straight to w as pcapng, or,
// with ring, into memory, the last ring bytes of them, written at the end.
type output struct {
	w        io.Writer
	name     string
	ring     int
	ng       *ngWriter
	perIface [2]uint64 // the frames written of each direction
	held     []heldFrame
	bytes    int // held's
}

// heldFrame is a frame a flight recorder keeps.
type heldFrame struct {
	iface  uint32
	t      time.Time
	data   []byte
	length int
}

// start writes the capture's header and its two interfaces.
func (o *output) start() error {
	ng, err := newNgWriter(o.w, "vmnetctl capture")
	if err == nil {
		err = ng.addInterface(o.name+": from the VM", maxFrame)
	}
	if err == nil {
		err = ng.addInterface(o.name+": to the VM", maxFrame)
	}
	if err == nil {
		err = ng.flush()
	}
	o.ng = ng
	return err
}

// frame writes a frame as it comes, or keeps it, letting the oldest go.
func (o *output) frame(iface uint32, t time.Time, data []byte, length int) error {
	if o.ring == 0 {
		o.perIface[iface]++
		if err := o.ng.writePacket(iface, t, data, length); err != nil {
			return err
		}
		return o.ng.flush()
	}
	o.held = append(o.held, heldFrame{iface, t, slices.Clone(data), length})
	o.bytes += len(data)
	drop := 0
	for o.bytes > o.ring && drop < len(o.held)-1 {
		o.bytes -= len(o.held[drop].data)
		drop++
	}
	if drop > 0 {
		// (Copied down, so that the slice's array does not grow.)
		o.held = append(o.held[:0], o.held[drop:]...)
	}
	return nil
}

// end writes what a flight recorder kept, then each interface's
// statistics. The kernel counts the socket's drops, not which way they
// went: they are told on the first interface.
func (o *output) end(dropped uint64) error {
	if o.ring > 0 {
		if err := o.start(); err != nil {
			return err
		}
		for _, f := range o.held {
			o.perIface[f.iface]++
			if err := o.ng.writePacket(f.iface, f.t, f.data, f.length); err != nil {
				return err
			}
		}
	}
	now := time.Now()
	if err := o.ng.writeStats(0, now, o.perIface[0], dropped); err != nil {
		return err
	}
	if err := o.ng.writeStats(1, now, o.perIface[1], 0); err != nil {
		return err
	}
	return o.ng.flush()
}

// htons is v in network byte order, as packet sockets take protocols.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
