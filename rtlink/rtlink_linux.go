package rtlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counters are a link's kernel counters (rtnl_link_stats64's first
// eight): rx is what the link received, tx what it sent. On a TAP, rx is
// what the VMM wrote into it, tx what the kernel gave the VMM.
type Counters struct {
	RxPackets, TxPackets uint64
	RxBytes, TxBytes     uint64
	RxErrors, TxErrors   uint64
	RxDropped, TxDropped uint64
}

// Link is what Conn.Link reads of a link.
type Link struct {
	// Name and Alias are its IFLA_IFNAME and IFLA_IFALIAS.
	Name, Alias string
	// Flags are the link's ifi_flags (unix.IFF_UP, unix.IFF_LOWER_UP...).
	Flags    uint32
	Counters Counters
}

// ErrGone says the link of an index is not there (ENODEV).
var ErrGone = unix.ENODEV

// Conn is a netlink socket for requests about links, kept open between
// them: a holder that reads its TAP's counters every few seconds opens no
// socket each time. Its calls are not for several goroutines at once.
type Conn struct {
	fd  int
	seq uint32
	buf []byte
}

// Open opens a Conn in this thread's network namespace.
func Open() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	return &Conn{fd: fd, buf: make([]byte, 32<<10)}, nil
}

// Close closes c.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// Link reads the flags and counters of the link of interface index:
// ErrGone if there is none.
func (c *Conn) Link(index int) (Link, error) {
	msgs, err := c.request(unix.RTM_GETLINK, 0, index)
	if err != nil {
		return Link{}, err
	}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		ifi := (*unix.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
		if int(ifi.Index) != index {
			continue
		}
		l := Link{Flags: ifi.Flags}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return Link{}, fmt.Errorf("link %d: %w", index, err)
		}
		for _, a := range attrs {
			switch v := a.Value; a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) {
			case unix.IFLA_IFNAME:
				l.Name = unix.ByteSliceToString(v)
			case unix.IFLA_IFALIAS:
				l.Alias = unix.ByteSliceToString(v)
			case unix.IFLA_STATS64:
				if len(v) >= 8*8 {
					u := func(i int) uint64 { return binary.NativeEndian.Uint64(v[8*i:]) }
					l.Counters = Counters{RxPackets: u(0), TxPackets: u(1), RxBytes: u(2), TxBytes: u(3),
						RxErrors: u(4), TxErrors: u(5), RxDropped: u(6), TxDropped: u(7)}
				}
			}
		}
		return l, nil
	}
	return Link{}, fmt.Errorf("link %d: no link in the kernel's answer", index)
}

// Delete deletes the link of interface index; one already gone is not an
// error. The kernel gives a new link the next free index unless its
// maker asks for one: check that the link of the index is still the one
// meant (Link) before.
func (c *Conn) Delete(index int) error {
	_, err := c.request(unix.RTM_DELLINK, unix.NLM_F_ACK, index)
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// request sends a request of type typ about link index and returns the
// messages of its answer, or the errno the kernel answered with.
func (c *Conn) request(typ uint16, flags uint16, index int) ([]syscall.NetlinkMessage, error) {
	seq := atomic.AddUint32(&c.seq, 1)
	var req [unix.SizeofNlMsghdr + unix.SizeofIfInfomsg]byte
	h := (*unix.NlMsghdr)(unsafe.Pointer(&req[0]))
	*h = unix.NlMsghdr{Len: uint32(len(req)), Type: typ, Flags: unix.NLM_F_REQUEST | flags, Seq: seq}
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&req[unix.SizeofNlMsghdr]))
	*ifi = unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index)}
	if err := unix.Sendto(c.fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("link %d: %w", index, err)
	}
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("link %d: %w", index, err)
		}
		msgs, err := syscall.ParseNetlinkMessage(c.buf[:n])
		if err != nil {
			return nil, fmt.Errorf("link %d: %w", index, err)
		}
		var answer []syscall.NetlinkMessage
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // the rest of an earlier request's answer
			}
			if m.Header.Type == unix.NLMSG_ERROR {
				if len(m.Data) < 4 {
					return nil, fmt.Errorf("link %d: a short error message", index)
				}
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return nil, fmt.Errorf("link %d: %w", index, syscall.Errno(-e))
				}
				return answer, nil // the acknowledgement
			}
			answer = append(answer, m)
		}
		if len(answer) > 0 && flags&unix.NLM_F_ACK == 0 {
			return answer, nil
		}
	}
}

// Deletion hears of one link's deletion, and of nothing else: the kernel
// filters the link notices of its namespace (a classic BPF program on the
// socket) down to RTM_DELLINK of the link's interface index. A process
// that waits for its link to go (the holder of an `attach: tap` TAP, one
// a VM of a fleet) is then not woken, nor made to parse, by every other
// link a fleet makes and deletes: with a plain subscription, each of N
// such holders read every notice of the others, N squared a fleet's up.
type Deletion struct {
	f   *os.File // in Go's poller: Close wakes a Wait
	raw syscall.RawConn
	buf []byte
}

// WatchDeletion starts hearing of the deletion of the link of interface
// index in this thread's namespace. A deletion before the call is not
// heard: look for the link once the watch is on.
func WatchDeletion(index int) (*Deletion, error) {
	fail := func(err error) (*Deletion, error) {
		return nil, fmt.Errorf("watching link %d: %w", index, err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return fail(err)
	}
	prog := deletionFilter(uint32(index))
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("filtering its notices: %w", err))
	}
	// Filtered before it joins the group: no other link's notice gets in.
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK}); err != nil {
		unix.Close(fd)
		return fail(err)
	}
	f := os.NewFile(uintptr(fd), "rtnetlink link notices")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fail(err)
	}
	return &Deletion{f: f, raw: raw, buf: make([]byte, 8<<10)}, nil
}

// deletionFilter keeps the link notices that are RTM_DELLINK of interface
// index and drops the others. A notice is one message (nlmsghdr, then
// ifinfomsg, whose ifi_index is at 20); a filter loads in network order,
// the message is in the host's: the values compared are as it loads them.
func deletionFilter(index uint32) []unix.SockFilter {
	var b [4]byte
	binary.NativeEndian.PutUint16(b[:2], unix.RTM_DELLINK)
	typ := uint32(binary.BigEndian.Uint16(b[:2]))
	binary.NativeEndian.PutUint32(b[:], index)
	idx := binary.BigEndian.Uint32(b[:])
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 4},                  // nlmsg_type
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: typ}, // not a deletion: drop
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 20},                 // ifi_index
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: idx}, // another link's: drop
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// Wait returns once a notice of the deletion came (nil), or with the
// socket's error: ENOBUFS when notices were lost (NoticesLost), another
// once the watch is closed or broken. On nil or ENOBUFS, look whether the
// link is there.
func (w *Deletion) Wait() error {
	for {
		var n int
		var rerr error
		err := w.raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), w.buf, 0)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(w.buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.RTM_DELLINK {
				return nil
			}
		}
	}
}

// Close ends the watch; a Wait under way returns.
func (w *Deletion) Close() { w.f.Close() }

// NoticesLost is whether err, from Wait, says notices were lost.
func NoticesLost(err error) bool { return errors.Is(err, unix.ENOBUFS) }
