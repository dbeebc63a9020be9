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

	"github.com/vmnetctl/vmnetctl/helperproto"
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
	// Index is its interface index, Master its master's (0: none).
	Index, Master int
	// Name and Alias are its IFLA_IFNAME and IFLA_IFALIAS.
	Name, Alias string
	// Flags are the link's ifi_flags (unix.IFF_UP, unix.IFF_LOWER_UP...).
	Flags    uint32
	Counters Counters
}

// TapCounts are l's counters and carrier as a TAP's
// (helperproto.TapMeter).
func (l Link) TapCounts() helperproto.TapCounts {
	k := l.Counters
	return helperproto.TapCounts{RxPackets: k.RxPackets, RxBytes: k.RxBytes, RxDropped: k.RxDropped,
		TxPackets: k.TxPackets, TxBytes: k.TxBytes, TxDropped: k.TxDropped, Held: l.Flags&unix.IFF_LOWER_UP != 0}
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

// Link reads the name, flags and counters of the link of interface
// index: ErrGone if there is none.
func (c *Conn) Link(index int) (Link, error) {
	msgs, err := c.request(unix.RTM_GETLINK, 0, index, nil)
	if err != nil {
		return Link{}, err
	}
	for _, m := range msgs {
		if l, ok, err := parseLink(m); err != nil || ok && l.Index == index {
			return l, err
		}
	}
	return Link{}, fmt.Errorf("link %d: no link in the kernel's answer", index)
}

// LinkByName reads the link named name as Link reads one by index:
// ErrGone if there is none.
func (c *Conn) LinkByName(name string) (Link, error) {
	if len(name) == 0 || len(name) >= unix.IFNAMSIZ {
		return Link{}, ErrGone
	}
	attr := make([]byte, 4+(len(name)+1+3)&^3)
	binary.NativeEndian.PutUint16(attr[0:], uint16(4+len(name)+1))
	binary.NativeEndian.PutUint16(attr[2:], unix.IFLA_IFNAME)
	copy(attr[4:], name)
	msgs, err := c.request(unix.RTM_GETLINK, 0, 0, attr)
	if err != nil {
		return Link{}, err
	}
	for _, m := range msgs {
		if l, ok, err := parseLink(m); err != nil || ok && l.Name == name {
			return l, err
		}
	}
	return Link{}, fmt.Errorf("link %s: no link in the kernel's answer", name)
}

// Ports reads the links whose master is the link of interface index
// master (a bridge's ports) in one dump, which the kernel filters by
// master (one that does not is filtered here).
func (c *Conn) Ports(master int) ([]Link, error) {
	var attr [8]byte
	binary.NativeEndian.PutUint16(attr[0:], 8)
	binary.NativeEndian.PutUint16(attr[2:], unix.IFLA_MASTER)
	binary.NativeEndian.PutUint32(attr[4:], uint32(master))
	msgs, err := c.request(unix.RTM_GETLINK, unix.NLM_F_DUMP, 0, attr[:])
	if err != nil {
		return nil, err
	}
	var ports []Link
	for _, m := range msgs {
		l, ok, err := parseLink(m)
		if err != nil {
			return nil, err
		}
		if ok && l.Master == master {
			ports = append(ports, l)
		}
	}
	return ports, nil
}

// parseLink reads m, if it is a link's message (ok).
func parseLink(m syscall.NetlinkMessage) (l Link, ok bool, err error) {
	if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
		return Link{}, false, nil
	}
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
	l = Link{Index: int(ifi.Index), Flags: ifi.Flags}
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return Link{}, false, fmt.Errorf("link %d: %w", l.Index, err)
	}
	for _, a := range attrs {
		switch v := a.Value; a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) {
		case unix.IFLA_IFNAME:
			l.Name = unix.ByteSliceToString(v)
		case unix.IFLA_IFALIAS:
			l.Alias = unix.ByteSliceToString(v)
		case unix.IFLA_MASTER:
			if len(v) >= 4 {
				l.Master = int(binary.NativeEndian.Uint32(v))
			}
		case unix.IFLA_STATS64:
			if len(v) >= 8*8 {
				u := func(i int) uint64 { return binary.NativeEndian.Uint64(v[8*i:]) }
				l.Counters = Counters{RxPackets: u(0), TxPackets: u(1), RxBytes: u(2), TxBytes: u(3),
					RxErrors: u(4), TxErrors: u(5), RxDropped: u(6), TxDropped: u(7)}
			}
		}
	}
	return l, true, nil
}

// Delete deletes the link of interface index; one already gone is not an
// error. The kernel gives a new link the next free index unless its
// maker asks for one: check that the link of the index is still the one
// meant (Link) before.
func (c *Conn) Delete(index int) error {
	_, err := c.request(unix.RTM_DELLINK, unix.NLM_F_ACK, index, nil)
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// request sends a request of type typ about link index (with attributes
// attrs, already laid out) and returns the messages of its answer, or the
// errno the kernel answered with: of a dump, every part up to its end.
func (c *Conn) request(typ uint16, flags uint16, index int, attrs []byte) ([]syscall.NetlinkMessage, error) {
	seq := atomic.AddUint32(&c.seq, 1)
	req := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg+len(attrs))
	h := (*unix.NlMsghdr)(unsafe.Pointer(&req[0]))
	*h = unix.NlMsghdr{Len: uint32(len(req)), Type: typ, Flags: unix.NLM_F_REQUEST | flags, Seq: seq}
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&req[unix.SizeofNlMsghdr]))
	*ifi = unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index)}
	copy(req[unix.SizeofNlMsghdr+unix.SizeofIfInfomsg:], attrs)
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("link %d: %w", index, err)
	}
	dump := flags&unix.NLM_F_DUMP == unix.NLM_F_DUMP
	var answer []syscall.NetlinkMessage
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
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // the rest of an earlier request's answer
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, fmt.Errorf("link %d: a short error message", index)
				}
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return nil, fmt.Errorf("link %d: %w", index, syscall.Errno(-e))
				}
				return answer, nil // the acknowledgement
			case unix.NLMSG_DONE:
				return answer, nil // a dump's end
			}
			// A dump's parts are copies: the buffer is read into again.
			m.Data = append([]byte(nil), m.Data...)
			answer = append(answer, m)
		}
		if len(answer) > 0 && !dump && flags&unix.NLM_F_ACK == 0 {
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
