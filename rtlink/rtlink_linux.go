package rtlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"os"
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
	fd     int
	seq    uint32
	buf    []byte
	strict bool // NETLINK_GET_STRICT_CHK asked for (Addrs)
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
	var l Link
	found := false
	err := c.request(unix.RTM_GETLINK, 0, index, nil, func(m []byte) {
		if got, ok := parseLink(m); ok && got.Index == index {
			l, found = got, true
		}
	})
	if err == nil && !found {
		err = fmt.Errorf("link %d: no link in the kernel's answer", index)
	}
	return l, err
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
	var l Link
	found := false
	err := c.request(unix.RTM_GETLINK, 0, 0, attr, func(m []byte) {
		if got, ok := parseLink(m); ok && got.Name == name {
			l, found = got, true
		}
	})
	if err == nil && !found {
		err = fmt.Errorf("link %s: no link in the kernel's answer", name)
	}
	return l, err
}

// Index is the interface index of the link named name (ErrGone: none),
// asked of that link alone. Go's net.InterfaceByName reads every link of
// the host to find one: with 10,000 VM ports, a 20 MB dump each time.
func Index(name string) (int, error) {
	c, err := Open()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	l, err := c.LinkByName(name)
	switch {
	case errors.Is(err, ErrGone):
		return 0, fmt.Errorf("no link %s: %w", name, ErrGone)
	case err != nil:
		return 0, err
	}
	return l.Index, nil
}

// Ports reads the links whose master is the link of interface index
// master (a bridge's ports) in one dump, which the kernel filters by
// master (one that does not is filtered here).
func (c *Conn) Ports(master int) ([]Link, error) {
	var attr [8]byte
	binary.NativeEndian.PutUint16(attr[0:], 8)
	binary.NativeEndian.PutUint16(attr[2:], unix.IFLA_MASTER)
	binary.NativeEndian.PutUint32(attr[4:], uint32(master))
	var ports []Link
	err := c.request(unix.RTM_GETLINK, unix.NLM_F_DUMP, 0, attr[:], func(m []byte) {
		if l, ok := parseLink(m); ok && l.Master == master {
			ports = append(ports, l)
		}
	})
	if err != nil {
		return nil, err
	}
	return ports, nil
}

// parseLink reads the body m of a link's message (ifinfomsg, then its
// attributes), as much of it as is well formed, without allocating but
// for its strings; ok is false for one too short to be a link's.
func parseLink(m []byte) (l Link, ok bool) {
	if len(m) < unix.SizeofIfInfomsg {
		return Link{}, false
	}
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&m[0]))
	l = Link{Index: int(ifi.Index), Flags: ifi.Flags}
	for typ, v := range attrs(m[unix.SizeofIfInfomsg:]) {
		switch typ {
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
	return l, true
}

// attrs yields the type (its flags masked) and value of each attribute
// of b, up to the first that is not whole and well formed.
func attrs(b []byte) iter.Seq2[uint16, []byte] {
	return func(yield func(uint16, []byte) bool) {
		for len(b) >= 4 {
			n := int(binary.NativeEndian.Uint16(b))
			if n < 4 || n > len(b) {
				return
			}
			if !yield(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:n]) {
				return
			}
			b = b[min((n+3)&^3, len(b)):]
		}
	}
}

// Delete deletes the link of interface index; one already gone is not an
// error. The kernel gives a new link the next free index unless its
// maker asks for one: check that the link of the index is still the one
// meant (Link) before.
func (c *Conn) Delete(index int) error {
	err := c.request(unix.RTM_DELLINK, unix.NLM_F_ACK, index, nil, func([]byte) {})
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// request sends a request of type typ about link index (with attributes
// attrs, already laid out) and passes the body of each RTM_NEWLINK of its
// answer (of a dump, every part up to its end) to each, which must not
// keep it (the buffer is read into again); it returns the errno the
// kernel answered with, if any.
func (c *Conn) request(typ uint16, flags uint16, index int, attrs []byte, each func(body []byte)) error {
	var ifi [unix.SizeofIfInfomsg]byte
	binary.NativeEndian.PutUint32(ifi[4:], uint32(int32(index)))
	_, err := c.ask(typ, flags, unix.RTM_NEWLINK, index, append(ifi[:], attrs...), each)
	return err
}

// ask sends a request of type typ whose body (its header, then its
// attributes) is body, and passes the body of each message of type answer
// in the reply to each, as request does; index names the link in errors.
// interrupted tells a dump the kernel marked NLM_F_DUMP_INTR (what it
// lists changed while it ran: some may be missing).
func (c *Conn) ask(typ, flags, answer uint16, index int, body []byte, each func(body []byte)) (interrupted bool, err error) {
	c.seq++
	seq := c.seq
	req := make([]byte, unix.SizeofNlMsghdr+len(body))
	h := (*unix.NlMsghdr)(unsafe.Pointer(&req[0]))
	*h = unix.NlMsghdr{Len: uint32(len(req)), Type: typ, Flags: unix.NLM_F_REQUEST | flags, Seq: seq}
	copy(req[unix.SizeofNlMsghdr:], body)
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("link %d: %w", index, err)
	}
	dump := flags&unix.NLM_F_DUMP == unix.NLM_F_DUMP
	answered := false
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return interrupted, fmt.Errorf("link %d: %w", index, err)
		}
		for b := c.buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			mh := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
			l := int(mh.Len)
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return interrupted, fmt.Errorf("link %d: a malformed answer", index)
			}
			body := b[unix.SizeofNlMsghdr:l]
			b = b[min((l+3)&^3, len(b)):]
			if mh.Seq != seq {
				continue // the rest of an earlier request's answer
			}
			interrupted = interrupted || mh.Flags&unix.NLM_F_DUMP_INTR != 0
			switch mh.Type {
			case unix.NLMSG_ERROR:
				if len(body) < 4 {
					return interrupted, fmt.Errorf("link %d: a short error message", index)
				}
				if e := int32(binary.NativeEndian.Uint32(body)); e != 0 {
					return interrupted, fmt.Errorf("link %d: %w", index, syscall.Errno(-e))
				}
				return interrupted, nil // the acknowledgement
			case unix.NLMSG_DONE:
				// A dump's end, with the error that ended it if any. (One
				// the kernel marked NLM_F_DUMP_INTR, links having changed
				// while it ran, may lack some or count some twice: its
				// callers read counters again at their next turn.)
				if len(body) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(body)); e < 0 {
						if index == 0 {
							return interrupted, fmt.Errorf("link dump: %w", syscall.Errno(-e))
						}
						return interrupted, fmt.Errorf("dump of link %d: %w", index, syscall.Errno(-e))
					}
				}
				return interrupted, nil
			case answer:
				each(body)
				answered = true
			}
		}
		if answered && !dump && flags&unix.NLM_F_ACK == 0 {
			return interrupted, nil
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
