package vhostuser

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/relay"
)

// Config is a backend's.
type Config struct {
	// Port is the descriptor frames go to and come from, one frame a
	// read or write: a TAP (IFF_TAP|IFF_NO_PI, no virtio-net header) or a
	// packet socket's end (SOCK_SEQPACKET). The backend sets it
	// non-blocking; it stays the caller's.
	Port int
	// VnetHdr says that the port's frames start with the 12-byte
	// virtio-net header (a TAP with IFF_VNET_HDR, TUNSETVNETHDRSZ 12,
	// little-endian): the backend then offers the guest checksum offload
	// and TSO both ways (OffloadFeatures) and passes the header through,
	// and SetOffloads, if set, is told what the guest takes (the TAP's
	// TUNSETOFFLOAD follows it: the kernel sends no segment the guest
	// cannot take).
	VnetHdr     bool
	SetOffloads func(csum, tso4, tso6 bool) error
	// Shaped gives the backend delay lines, which Shape sets: the link's
	// frames are then delayed, duplicated and reordered as they say
	// (shaping_linux.go); Close stops them.
	Shaped bool
	// Logf logs a line (a session that ended and why); nil: none.
	// Debugf, if set, logs every message the VMM sends.
	Logf, Debugf func(format string, args ...any)
}

// Stats counts what a backend moved, since it started.
type Stats struct {
	// ToVM and FromVM are frames and bytes (without the virtio-net
	// header) to and from the guest; Dropped, frames from the port that
	// found no buffer large enough in the guest's ring.
	ToVMFrames, ToVMBytes, FromVMFrames, FromVMBytes, Dropped atomic.Uint64
	// FromVMRefused counts the guest's frames dropped: whose virtio-net
	// header asks for what it did not negotiate (txHeaderOK), that a
	// shaped link's full line refused, or that the port refused.
	FromVMRefused atomic.Uint64
	// Sessions counts the VMMs that connected.
	Sessions atomic.Uint64
}

// Backend serves vhost-user-net on a listener, one VMM at a time.
type Backend struct {
	cfg   Config
	Stats Stats
	sh    *shaping // Config.Shaped's, or nil
}

// New returns a backend for cfg.
func New(cfg Config) *Backend {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	b := &Backend{cfg: cfg}
	if cfg.Shaped {
		var err error
		if b.sh, err = newShaping(b); err != nil {
			cfg.Logf("the link cannot be shaped: %v", err)
		}
	}
	return b
}

// Serve accepts VMMs on ln, one at a time, until ctx ends: a session ends
// when its VMM goes (or breaks the protocol, which is logged), and the
// next VMM on the socket (a restarted one) starts another.
func (b *Backend) Serve(ctx context.Context, ln *net.UnixListener) error {
	if err := unix.SetNonblock(b.cfg.Port, true); err != nil {
		return fmt.Errorf("vhost-user: the port: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("vhost-user: %w", err)
		}
		b.Stats.Sessions.Add(1)
		b.cfg.Logf("a VMM connected")
		endConn := context.AfterFunc(ctx, func() { c.Close() })
		err = b.serveConn(c)
		endConn()
		c.Close()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			b.cfg.Logf("the VMM's session ended: %v; waiting for the next VMM", err)
		default:
			b.cfg.Logf("the VMM went; waiting for the next")
		}
	}
}

// offered is the features the backend offers.
func (b *Backend) offered() uint64 {
	if b.cfg.VnetHdr {
		return Features | OffloadFeatures
	}
	return Features
}

// segments says whether the backend cuts the port's TCP segments into
// the guest's frames itself (relay.Segmenter): for a guest that takes no
// TSO, from a port that takes headers. The port then hands over up to
// 64 KiB a read where it would have handed over 45 frames.
func segments(vnetHdr bool, features uint64) bool {
	return vnetHdr && features&(FeatureGuestTSO4|FeatureGuestTSO6) == 0
}

// portOffloads is what the port may hand the backend for a guest that
// negotiated features: what the guest takes, or, where the backend
// segments, checksum offload and TSO both ways.
func portOffloads(features uint64) (csum, tso4, tso6 bool) {
	if segments(true, features) {
		return true, true, true
	}
	return features&FeatureGuestCSum != 0, features&FeatureGuestTSO4 != 0, features&FeatureGuestTSO6 != 0
}

// offloadsTaken says in words what a guest that negotiated features takes
// and what the backend does for it, for the log.
func offloadsTaken(vnetHdr bool, features uint64) string {
	var took []string
	for _, o := range []struct {
		f    uint64
		name string
	}{{FeatureCSum, "csum"}, {FeatureGuestCSum, "guest_csum"}, {FeatureGuestTSO4, "guest_tso4"}, {FeatureGuestTSO6, "guest_tso6"}, {FeatureHostTSO4, "host_tso4"}, {FeatureHostTSO6, "host_tso6"}} {
		if features&o.f != 0 {
			took = append(took, o.name)
		}
	}
	s := "no offloads"
	if len(took) > 0 {
		s = "offloads " + strings.Join(took, ", ")
	}
	if segments(vnetHdr, features) {
		s += " (the port's TCP segments cut into its frames here)"
	}
	return s
}

// session is one VMM's connection and what it set up.
type session struct {
	b        *Backend
	conn     *net.UnixConn
	features uint64 // acked (SET_FEATURES)
	protocol uint64 // acked (SET_PROTOCOL_FEATURES)
	mem      *Memory
	maps     [][]byte // the regions' mappings, to unmap
	queues   [numQueues]queue
	loop     *dataLoop // running, or nil
}

// queue is what the VMM set of one ring.
type queue struct {
	num        uint16
	addr       VringAddr
	hasAddr    bool
	base       uint16
	kick, call int // -1: none
	enabled    bool
	ring       vring
}

// newSession is a session of b on c, nothing set up.
func newSession(b *Backend, c *net.UnixConn) *session {
	s := &session{b: b, conn: c}
	for i := range s.queues {
		s.queues[i] = queue{kick: -1, call: -1}
	}
	return s
}

func (b *Backend) serveConn(c *net.UnixConn) (err error) {
	s := newSession(b, c)
	defer s.close()
	// Setting a ring up reads guest memory, which the VMM may have cut
	// under its mapping: a fault ends the session, not the helper.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverFault(&err)
	for {
		h, payload, fds, err := readMessage(c)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if s.b.cfg.Debugf != nil {
			s.b.cfg.Debugf("%s flags %#x payload %x, %d descriptors", h.Request, h.Flags, payload, len(fds))
		}
		reply, err := s.handle(h, payload, fds)
		if err != nil {
			return fmt.Errorf("%s: %w", h.Request, err)
		}
		if reply == nil && h.Flags&flagNeedReply != 0 && s.protocol&ProtocolReplyAck != 0 {
			reply = u64(0) // REPLY_ACK: success
		}
		if reply != nil {
			if err := writeMessage(c, Header{Request: h.Request, Flags: flagVersion | flagReply, Size: uint32(len(reply))}, reply); err != nil {
				return err
			}
		}
	}
}

// readMessage reads one message and the descriptors that came with it
// (close-on-exec). A payload over MaxPayload, or more than maxFDs
// descriptors, is an error (the descriptors are closed).
func readMessage(c *net.UnixConn) (Header, []byte, []int, error) {
	hdr := make([]byte, HeaderSize)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	var fds []int
	got := 0
	for got < HeaderSize {
		n, oobn, _, _, err := c.ReadMsgUnix(hdr[got:], oob)
		if oobn > 0 {
			more, perr := parseFDs(oob[:oobn])
			fds = append(fds, more...)
			if perr != nil {
				closeFDs(fds)
				return Header{}, nil, nil, perr
			}
		}
		if err != nil {
			closeFDs(fds)
			if got > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Header{}, nil, nil, err
		}
		if n == 0 {
			closeFDs(fds)
			if got > 0 {
				return Header{}, nil, nil, io.ErrUnexpectedEOF
			}
			return Header{}, nil, nil, io.EOF
		}
		got += n
	}
	h := decodeHeader(hdr)
	if h.Flags&versionMask != flagVersion {
		closeFDs(fds)
		return h, nil, nil, fmt.Errorf("vhost-user: a message of version %d", h.Flags&versionMask)
	}
	if h.Size > MaxPayload || len(fds) > maxFDs {
		closeFDs(fds)
		return h, nil, nil, fmt.Errorf("vhost-user: %s of %d bytes and %d descriptors", h.Request, h.Size, len(fds))
	}
	payload := make([]byte, h.Size)
	if _, err := io.ReadFull(c, payload); err != nil {
		closeFDs(fds)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return h, nil, nil, fmt.Errorf("vhost-user: %s's payload: %w", h.Request, err)
	}
	return h, payload, fds, nil
}

// parseFDs reads the descriptors of SCM_RIGHTS messages; they are made
// close-on-exec.
func parseFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		for _, fd := range got {
			unix.CloseOnExec(fd)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// writeMessage writes a message (no descriptors: the backend sends none).
func writeMessage(c *net.UnixConn, h Header, payload []byte) error {
	_, err := c.Write(append(h.encode(), payload...))
	return err
}

// handle carries out one request; the reply's payload, if it has one.
// Every descriptor in fds is used or closed.
func (s *session) handle(h Header, p []byte, fds []int) (reply []byte, err error) {
	used := false
	defer func() {
		if !used {
			closeFDs(fds)
		}
	}()
	need := func(n int) error {
		if len(p) < n {
			return fmt.Errorf("a payload of %d bytes, want %d", len(p), n)
		}
		return nil
	}
	switch h.Request {
	case GetFeatures:
		return u64(s.b.offered()), nil
	case SetFeatures:
		if err := need(8); err != nil {
			return nil, err
		}
		f, err := acked(binary.LittleEndian.Uint64(p)&^featureMTU, s.b.offered(), "features") // (qemu's host_mtu adds MTU: its own)
		if err != nil {
			return nil, err
		}
		if f&FeatureVersion1 == 0 {
			return nil, errors.New("features without VERSION_1: a legacy driver's 10-byte header is not supported")
		}
		// The data loop checks the guest's headers against the features:
		// it starts again with the new ones.
		return nil, s.changeRings(func() error {
			if s.b.cfg.SetOffloads != nil {
				csum, tso4, tso6 := portOffloads(f)
				if err := s.b.cfg.SetOffloads(csum, tso4, tso6); err != nil {
					return fmt.Errorf("the port's offloads: %w", err)
				}
			}
			s.features = f
			s.b.cfg.Logf("the guest takes %s", offloadsTaken(s.b.cfg.VnetHdr, f))
			return nil
		})
	case GetProtocolFeatures:
		return u64(ProtocolFeatures), nil
	case SetProtocolFeatures:
		if err := need(8); err != nil {
			return nil, err
		}
		s.protocol, err = acked(binary.LittleEndian.Uint64(p), ProtocolFeatures, "protocol features")
		return nil, err
	case SetOwner:
		return nil, nil
	case ResetOwner:
		s.stopLoop()
		s.resetQueues()
		s.features, s.protocol = 0, 0
		return nil, nil
	case GetQueueNum:
		return u64(numQueues), nil
	case SetMemTable:
		regions, err := decodeMemTable(p)
		if err != nil {
			return nil, err
		}
		if len(fds) != len(regions) {
			return nil, fmt.Errorf("%d regions with %d descriptors", len(regions), len(fds))
		}
		return nil, s.changeRings(func() error { return s.mapMemory(regions, fds) })
	case SetVringNum:
		return nil, s.setQueue(p, func(q *queue, num uint32) error {
			if num == 0 || num > maxQueueSize || num&(num-1) != 0 {
				return fmt.Errorf("a ring of %d entries (a power of 2 up to %d)", num, maxQueueSize)
			}
			q.num = uint16(num)
			return nil
		})
	case SetVringAddr:
		if err := need(vringAddrSize); err != nil {
			return nil, err
		}
		a := VringAddr{Index: binary.LittleEndian.Uint32(p[0:]), Flags: binary.LittleEndian.Uint32(p[4:]),
			Desc: binary.LittleEndian.Uint64(p[8:]), Used: binary.LittleEndian.Uint64(p[16:]),
			Avail: binary.LittleEndian.Uint64(p[24:]), Log: binary.LittleEndian.Uint64(p[32:])}
		q, err := s.queue(a.Index)
		if err != nil {
			return nil, err
		}
		return nil, s.changeRings(func() error {
			q.addr, q.hasAddr = a, true
			return nil
		})
	case SetVringBase:
		return nil, s.setQueue(p, func(q *queue, base uint32) error {
			q.base = uint16(base)
			return nil
		})
	case GetVringBase:
		// The ring stops; its next available entry goes back.
		if err := need(8); err != nil {
			return nil, err
		}
		idx := binary.LittleEndian.Uint32(p)
		q, err := s.queue(idx)
		if err != nil {
			return nil, err
		}
		err = s.changeRings(func() error {
			if q.ring.ready() {
				q.base = q.ring.lastAvail
			}
			q.ring, q.hasAddr, q.enabled = vring{}, false, false
			closeFD(&q.kick)
			closeFD(&q.call)
			return nil
		})
		return VringState{Index: idx, Num: uint32(q.base)}.encode(), err
	case SetVringKick, SetVringCall, SetVringErr:
		if err := need(8); err != nil {
			return nil, err
		}
		v := binary.LittleEndian.Uint64(p)
		q, err := s.queue(uint32(v & vringIndexMask))
		if err != nil {
			return nil, err
		}
		fd := -1
		if v&vringFDInvalid == 0 {
			if len(fds) != 1 {
				return nil, fmt.Errorf("%d descriptors, want 1", len(fds))
			}
			fd = fds[0]
		} else if len(fds) != 0 {
			return nil, fmt.Errorf("%d descriptors with the invalid flag", len(fds))
		}
		switch {
		case h.Request == SetVringErr:
			return nil, nil // errors are not reported back (fd closed)
		case h.Request == SetVringKick && fd < 0:
			return nil, errors.New("a ring without a kick (polling) is not supported")
		case fd >= 0:
			// An eventfd, non-blocking: anything else (a pipe whose
			// writer went polls readable for ever) or a blocking one
			// (whose counter the VMM filled) would hold the loop.
			if err := checkEventfd(fd); err != nil {
				return nil, err
			}
		}
		used = true
		return nil, s.changeRings(func() error {
			if h.Request == SetVringKick {
				closeFD(&q.kick)
				q.kick = fd
				if s.features&FeatureProtocolFeatures == 0 {
					q.enabled = true // without protocol features, a kick starts the ring
				}
			} else {
				closeFD(&q.call)
				q.call = fd
			}
			return nil
		})
	case SetVringEnable:
		return nil, s.setQueue(p, func(q *queue, on uint32) error {
			q.enabled = on != 0
			return nil
		})
	default:
		return nil, fmt.Errorf("not supported")
	}
}

// setQueue carries out a request whose payload is a ring's state (its
// index and a number): set changes the ring with the rings stopped.
func (s *session) setQueue(p []byte, set func(q *queue, num uint32) error) error {
	if len(p) < 8 {
		return fmt.Errorf("a payload of %d bytes, want 8", len(p))
	}
	q, err := s.queue(binary.LittleEndian.Uint32(p))
	if err != nil {
		return err
	}
	return s.changeRings(func() error { return set(q, binary.LittleEndian.Uint32(p[4:])) })
}

// changeRings makes change with the data loop stopped, then starts it
// again if a ring can run (not after a change that failed: the session
// ends).
func (s *session) changeRings(change func() error) error {
	s.stopLoop()
	if err := change(); err != nil {
		return err
	}
	return s.startLoop()
}

// acked is what the VMM acked of offered, what kind of features they
// are; one not offered is an error.
func acked(f, offered uint64, what string) (uint64, error) {
	if f&^offered != 0 {
		return 0, fmt.Errorf("%s %#x, of which %#x were not offered", what, f, f&^offered)
	}
	return f, nil
}

// queue is ring idx of the one pair.
func (s *session) queue(idx uint32) (*queue, error) {
	if idx >= numQueues {
		return nil, fmt.Errorf("ring %d; this backend has %d", idx, numQueues)
	}
	return &s.queues[idx], nil
}

// checkEventfd makes fd non-blocking if it is an eventfd, and says so if
// it is not. (The VMM shares its file description and could make it
// blocking again: then it holds only its own VM's helper, which its
// controller kills after its stop's grace.)
func checkEventfd(fd int) error {
	if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil || target != "anon_inode:[eventfd]" {
		return fmt.Errorf("a descriptor that is no eventfd (%s)", target)
	}
	return unix.SetNonblock(fd, true)
}

func closeFD(fd *int) {
	if *fd >= 0 {
		unix.Close(*fd)
		*fd = -1
	}
}

// mapMemory maps the regions of a new memory table (each from its
// descriptor, which is closed once mapped) in place of the old.
func (s *session) mapMemory(regions []Region, fds []int) error {
	// A new table under running rings (memory hotplug): the rings go on
	// where they were, not from their first base.
	for i := range s.queues {
		if q := &s.queues[i]; q.ring.ready() {
			q.base = q.ring.lastAvail
		}
	}
	s.unmap()
	mem := &Memory{}
	for i, r := range regions {
		if r.Size > 1<<46 || r.MmapOffset > 1<<46 {
			return fmt.Errorf("memory region %d: %d bytes at offset %d", i, r.Size, r.MmapOffset)
		}
		// What the file behind the descriptor holds: a region past its
		// end would fault (SIGBUS) when read. (A file cut later still
		// can: the data loop and the message handler recover from it.)
		var st unix.Stat_t
		if err := unix.Fstat(fds[i], &st); err != nil {
			return fmt.Errorf("memory region %d: %w", i, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < r.MmapOffset+r.Size {
			return fmt.Errorf("memory region %d: %d bytes at offset %d of a file of %d", i, r.Size, r.MmapOffset, st.Size)
		}
		data, err := unix.Mmap(fds[i], 0, int(r.MmapOffset+r.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			s.unmap()
			return fmt.Errorf("mapping memory region %d (%d bytes at offset %d): %w", i, r.Size, r.MmapOffset, err)
		}
		s.maps = append(s.maps, data)
		mem.regions = append(mem.regions, memRegion{Region: r, data: data[r.MmapOffset:]})
	}
	s.mem = mem
	return nil
}

func (s *session) unmap() {
	for _, m := range s.maps {
		unix.Munmap(m)
	}
	s.maps, s.mem = nil, nil
	for i := range s.queues {
		s.queues[i].ring = vring{}
	}
}

func (s *session) resetQueues() {
	for i := range s.queues {
		q := &s.queues[i]
		closeFD(&q.kick)
		closeFD(&q.call)
		*q = queue{kick: -1, call: -1}
	}
}

func (s *session) close() {
	s.stopLoop()
	s.resetQueues()
	s.unmap()
}

// runnable tells whether q can move frames: its memory, size, addresses
// and kick are set and it is enabled. Its ring is mapped here.
func (s *session) runnable(q *queue) (bool, error) {
	if s.mem == nil || q.num == 0 || !q.hasAddr || q.kick < 0 || !q.enabled {
		return false, nil
	}
	if !q.ring.ready() {
		if err := q.ring.setup(s.mem, q.num, q.addr); err != nil {
			return false, err
		}
		q.ring.lastAvail = q.base
		// The used index starts where the guest expects it: as it was
		// left (the base) for a ring set up anew.
		q.ring.usedIdx = load16(q.ring.used[2:])
	}
	return true, nil
}

// startLoop starts the data loop if a ring can run.
func (s *session) startLoop() error {
	var run [numQueues]*queue
	any := false
	for i := range s.queues {
		ok, err := s.runnable(&s.queues[i])
		if err != nil {
			return err
		}
		if ok {
			run[i], any = &s.queues[i], true
		}
	}
	if !any {
		return nil
	}
	// A ring the guest broke ends the session: the VMM sees its backend
	// go (qemu reconnects with reconnect=N and sets the rings up anew).
	l, err := startDataLoop(s.b, run, s.features, func() { s.conn.Close() })
	if err != nil {
		return err
	}
	s.loop = l
	return nil
}

func (s *session) stopLoop() {
	if s.loop != nil {
		s.loop.stop()
		s.loop = nil
	}
}

// dataLoop moves frames for a session's running rings until stopped.
type dataLoop struct {
	b        *Backend
	features uint64 // the session's
	// For a guest that sends frames of its MTU (no TSO) to a port that
	// takes headers: its TCP segments go in batches, runs of them merged
	// into one packet (relay.Coalescer), as the datagram relay does.
	co       *relay.Coalescer
	slots    [][]byte // coBatch slots of coSlot bytes, made once needed
	batch    [][]byte // the slots in use, each a zero header and a frame
	coalesce bool     // the guest sends no TSO, and the port takes headers
	// For a guest that takes no TSO from a port that takes headers: the
	// port's packet being cut (in, read whole), into frame.
	segment   bool
	seg       relay.Segmenter
	in, frame []byte
	rx        *queue // nil: not running
	tx        *queue
	wake      int // an eventfd: stop
	wg        sync.WaitGroup
}

func startDataLoop(b *Backend, run [numQueues]*queue, features uint64, broken func()) (*dataLoop, error) {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if b.sh != nil && b.sh.pending.Load() > 0 {
		unix.Write(b.sh.wake, u64(1)) // (frames a loop before left: this one delivers them)
	}
	l := &dataLoop{b: b, rx: run[rxQueue], tx: run[txQueue], wake: wake, features: features,
		coalesce: b.cfg.VnetHdr && features&(FeatureHostTSO4|FeatureHostTSO6) == 0,
		segment:  segments(b.cfg.VnetHdr, features)}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		debug.SetPanicOnFault(true) // (this goroutine's: a fault in guest memory ends the session)
		if err := l.runRecovering(); err != nil {
			b.cfg.Logf("the rings stopped: %v", err)
			broken()
		}
	}()
	return l, nil
}

func (l *dataLoop) stop() {
	unix.Write(l.wake, u64(1))
	l.wg.Wait()
	unix.Close(l.wake)
}

// runRecovering is run, with a fault reading or writing guest memory (a
// VMM that cut the file behind it) an error.
func (l *dataLoop) runRecovering() (err error) {
	defer recoverFault(&err)
	return l.run()
}

// recoverFault turns a memory fault (with debug.SetPanicOnFault) into
// *err; any other panic goes on.
func recoverFault(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		*err = fmt.Errorf("a fault at %#x in the guest's memory (did its VMM cut the file behind it?)", f.Addr())
		return
	}
	panic(r)
}

// run polls the kicks, the port and the stop, and moves frames.
func (l *dataLoop) run() error {
	port := l.b.cfg.Port
	hdr := make([]byte, NetHeaderSize)
	iov := make([]unix.Iovec, 0, 64)
	var c chain
	rxWaits := false // the guest gave no buffers: the port waits for its kick
	// more: a direction stopped at its batch's bound with work left (a
	// guest that keeps its ring full, a port that keeps filling): the
	// poll only looks, so that the other direction and the stop get
	// their turn.
	more := false
	for {
		pfds := []unix.PollFd{{Fd: int32(l.wake), Events: unix.POLLIN}}
		if l.tx != nil {
			pfds = append(pfds, unix.PollFd{Fd: int32(l.tx.kick), Events: unix.POLLIN})
		}
		rxKickAt, portAt, readyAt := -1, -1, -1
		// A shaped link takes what the port has whatever the ring has: it
		// goes into the line (toVMShaped).
		shaped := l.b.sh != nil && l.b.sh.toVM.Active()
		if l.rx != nil {
			rxKickAt = len(pfds)
			pfds = append(pfds, unix.PollFd{Fd: int32(l.rx.kick), Events: unix.POLLIN})
			if !rxWaits || shaped {
				portAt = len(pfds)
				pfds = append(pfds, unix.PollFd{Fd: int32(port), Events: unix.POLLIN})
			}
			if l.b.sh != nil {
				readyAt = len(pfds)
				pfds = append(pfds, unix.PollFd{Fd: int32(l.b.sh.wake), Events: unix.POLLIN})
			}
		}
		timeout := -1
		if more {
			timeout = 0
		}
		if _, err := unix.Poll(pfds, timeout); err != nil && err != unix.EINTR {
			return err
		}
		txMore, rxMore := false, false
		if pfds[0].Revents != 0 {
			return nil
		}
		if l.tx != nil {
			if pfds[1].Revents != 0 {
				drainEventfd(l.tx.kick)
			}
			var err error
			if txMore, err = l.fromVM(&c, iov); err != nil {
				return err
			}
		}
		if l.rx != nil {
			if pfds[rxKickAt].Revents != 0 {
				drainEventfd(l.rx.kick)
				rxWaits = false
			}
			portReady := portAt >= 0 && pfds[portAt].Revents != 0
			if shaped && portReady {
				m, err := l.toVMShaped()
				if err != nil {
					return fmt.Errorf("reading the port: %w", err)
				}
				rxMore = m
			}
			if readyAt >= 0 && pfds[readyAt].Revents != 0 || l.b.sh != nil && !rxWaits && l.b.sh.pending.Load() > 0 {
				if readyAt >= 0 && pfds[readyAt].Revents != 0 {
					drainEventfd(l.b.sh.wake)
				}
				waits, err := l.deliverShaped(&c)
				if err != nil {
					return err
				}
				rxWaits = waits
			}
			if !shaped && (portReady || !rxWaits) {
				waits, m, err := l.toVM(&c, iov, hdr)
				if err != nil {
					return err
				}
				rxWaits, rxMore = waits, m
			}
		}
		more = txMore || rxMore
	}
}

// maxBatch bounds the chains one direction takes before the loop looks at
// the other and at its stop; coBatch the frames merged at once, and
// coSlot the room of each (a larger frame goes alone).
const (
	maxBatch = 256
	coBatch  = 64
	coSlot   = NetHeaderSize + 9216
)

// flush writes the batch, merged where it can be.
func (l *dataLoop) flush() {
	if len(l.batch) == 0 {
		return
	}
	packets, bytes, drops := l.co.Write(l.batch, func(f []byte) bool {
		if l.b.sh != nil && l.b.sh.fromVM.Active() {
			return l.b.sh.fromVM.Push(f)
		}
		_, err := unix.Write(l.b.cfg.Port, f)
		return err == nil // (a port that cannot take it drops it, as a NIC would)
	})
	l.b.Stats.FromVMFrames.Add(packets)
	l.b.Stats.FromVMBytes.Add(bytes)
	l.b.Stats.FromVMRefused.Add(drops)
	l.batch = l.batch[:0]
}

// batchFrame copies the frame of chain c (its buffers past the header,
// size bytes) into the next slot behind a zero header, if it fits.
func (l *dataLoop) batchFrame(c *chain, size uint64) bool {
	if NetHeaderSize+size > coSlot {
		return false
	}
	if l.co == nil {
		l.co = relay.NewCoalescer()
		for range coBatch {
			l.slots = append(l.slots, make([]byte, coSlot))
		}
	}
	slot := l.slots[len(l.batch)][:NetHeaderSize+size]
	clear(slot[:NetHeaderSize])
	skip, at := NetHeaderSize, NetHeaderSize
	for _, b := range c.read {
		k := min(skip, len(b))
		skip -= k
		at += copy(slot[at:], b[k:])
	}
	l.batch = append(l.batch, slot)
	if len(l.batch) == coBatch {
		l.flush()
	}
	return true
}

// fromVM writes the frames the guest made available on its TX ring to the
// port, straight from guest memory (the header skipped), and gives the
// chains back.
func (l *dataLoop) fromVM(c *chain, iov []unix.Iovec) (more bool, err error) {
	q := &l.tx.ring
	used := l.used(l.tx)
	for {
		if used.n >= maxBatch {
			more = true
			break
		}
		ok, err := q.next(c)
		if err != nil {
			return false, err
		}
		if !ok {
			break
		}
		// The guest's header is copied out of its memory, checked against
		// what it negotiated and, for a port that takes headers, written
		// from the copy: the guest cannot change it after the check.
		var hdr [NetHeaderSize]byte
		iov = iov[:0]
		if l.b.cfg.VnetHdr {
			iov = append(iov, unix.Iovec{Base: &hdr[0], Len: NetHeaderSize})
		}
		skip := uint64(NetHeaderSize)
		var size uint64
		for _, b := range c.read {
			if skip > 0 {
				k := copy(hdr[NetHeaderSize-skip:], b)
				skip -= uint64(k)
				b = b[k:]
			}
			if len(b) == 0 {
				continue
			}
			iov = append(iov, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
			size += uint64(len(b))
		}
		hdr[10], hdr[11] = 0, 0 // num_buffers: the guest's own
		switch {
		case skip > 0 || size == 0 || len(iov) > 1024:
			// No frame after the header (or one in over 1024 pieces).
		case !txHeaderOK(hdr, l.features):
			l.b.Stats.FromVMRefused.Add(1)
		case l.coalesce && l.batchFrame(c, size):
		case l.b.sh != nil && l.b.sh.fromVM.Active():
			l.flush() // (in order)
			f := make([]byte, 0, NetHeaderSize+size)
			for _, v := range iov {
				f = append(f, unsafe.Slice(v.Base, v.Len)...)
			}
			if l.b.sh.fromVM.Push(f) {
				l.b.Stats.FromVMFrames.Add(1)
				l.b.Stats.FromVMBytes.Add(size)
			} else {
				l.b.Stats.FromVMRefused.Add(1)
			}
		default:
			l.flush() // (in order)
			if _, err := writev(l.b.cfg.Port, iov); err == nil {
				l.b.Stats.FromVMFrames.Add(1)
				l.b.Stats.FromVMBytes.Add(size)
			}
			// (a port that cannot take it now drops it, as a NIC would)
		}
		used.put(c.head, 0)
	}
	l.flush()
	used.done()
	return more, nil
}

// rxChain takes the next chain of the RX ring and checks that it is
// one the device may write a frame into; ok false: the ring has none.
func (l *dataLoop) rxChain(c *chain) (ok bool, err error) {
	q := &l.rx.ring
	if ok, err = q.next(c); !ok || err != nil {
		return false, err
	}
	if len(c.read) > 0 || c.writeLen < NetHeaderSize {
		return false, fmt.Errorf("%w: RX chain %d has %d readable buffers and %d bytes to write", errRing, c.head, len(c.read), c.writeLen)
	}
	if len(c.written) > 1000 { // (readv's 1024 pieces, the spill byte's among them)
		return false, fmt.Errorf("%w: RX chain %d has %d buffers (at most 1000)", errRing, c.head, len(c.written))
	}
	return true, nil
}

// buffers makes the loop's packet and frame buffers once needed: a packet
// as large as the port hands over (and a byte more: a read that fills it
// was cut), a frame as large, behind its header.
func (l *dataLoop) buffers() {
	if l.in == nil {
		l.in = make([]byte, NetHeaderSize+relay.TapMaxPacket+1)
		l.frame = make([]byte, NetHeaderSize+relay.TapMaxPacket)
	}
}

// scatter copies f into the chain's buffers bufs, as far as they go.
func scatter(bufs [][]byte, f []byte) {
	for _, b := range bufs {
		f = f[copy(b, f):]
		if len(f) == 0 {
			return
		}
	}
}

// toVMSegmenting is toVM for a guest without TSO on a port with it: it
// reads a packet of up to 64 KiB from the port and cuts it into the
// chains (relay.Segmenter), one frame each behind a header that asks for
// nothing; a packet whose frames the ring has no room for yet waits,
// half cut, for the guest's kick.
func (l *dataLoop) toVMSegmenting(c *chain) (waits, more bool, err error) {
	q := &l.rx.ring
	l.buffers()
	used := l.used(l.rx)
	defer used.done()
	for tries := 0; ; tries++ {
		if tries >= maxBatch {
			return false, true, nil
		}
		if !l.seg.More() {
			got, err := unix.Read(l.b.cfg.Port, l.in)
			if err == unix.EAGAIN || err == unix.EINTR || got == 0 && err == nil {
				return false, false, nil
			}
			if err != nil {
				return false, false, fmt.Errorf("reading the port: %w", err)
			}
			if got == len(l.in) || l.seg.Reset(l.in[:got], len(l.frame)-NetHeaderSize) != nil {
				l.b.Stats.Dropped.Add(1)
				continue
			}
		}
		ok, err := l.rxChain(c)
		if err != nil || !ok {
			return err == nil, false, err
		}
		// The frame is cut in the backend's memory, behind a header that
		// asks for nothing, and copied into the guest's: the guest cannot
		// change it under the checksums.
		f := l.frame[:NetHeaderSize+l.seg.Next(l.frame[NetHeaderSize:])]
		if uint64(len(f)) > c.writeLen {
			q.lastAvail-- // (the chain serves the next frame)
			l.b.Stats.Dropped.Add(1)
			continue
		}
		clear(f[:NetHeaderSize])
		binary.LittleEndian.PutUint16(f[10:], 1) // num_buffers
		scatter(c.written, f)
		l.b.Stats.ToVMFrames.Add(1)
		l.b.Stats.ToVMBytes.Add(uint64(len(f) - NetHeaderSize))
		used.put(c.head, uint32(len(f)))
	}
}

// toVM reads frames from the port straight into the chains the guest
// made available on its RX ring, the header written first, until the port
// has none or the ring none; waits says that the ring ran out (the port
// then waits for the guest's kick).
func (l *dataLoop) toVM(c *chain, iov []unix.Iovec, hdr []byte) (waits, more bool, err error) {
	if l.segment {
		return l.toVMSegmenting(c)
	}
	q := &l.rx.ring
	used := l.used(l.rx)
	defer used.done()
	var spill [1]byte
	for tries := 0; ; tries++ {
		if tries >= maxBatch {
			return false, true, nil
		}
		ok, err := l.rxChain(c)
		if err != nil || !ok {
			return err == nil, false, err
		}
		iov = iov[:0]
		if l.b.cfg.VnetHdr {
			// The port writes the header (its num_buffers left as it
			// was: set below).
			for _, b := range c.written {
				if len(b) > 0 {
					iov = append(iov, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
				}
			}
		} else {
			// The header: zero (no offloads), one buffer.
			clear(hdr)
			binary.LittleEndian.PutUint16(hdr[10:], 1)
			left := hdr
			for _, b := range c.written {
				k := copy(b, left)
				left = left[k:]
				if b = b[k:]; len(b) > 0 {
					iov = append(iov, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
				}
			}
		}
		if len(iov) == 0 {
			return false, false, fmt.Errorf("%w: RX chain %d has room for the header alone", errRing, c.head)
		}
		// A byte past the chain: a read that reaches it had a frame
		// larger than the chain (a TAP's read says only what it copied).
		iov = append(iov, unix.Iovec{Base: &spill[0], Len: 1})
		got, err := readv(l.b.cfg.Port, iov)
		if err == unix.EAGAIN || err == unix.EINTR || got == 0 && err == nil {
			q.lastAvail-- // not used: the guest's again
			return false, false, nil
		}
		if err != nil {
			q.lastAvail--
			return false, false, fmt.Errorf("reading the port: %w", err)
		}
		// A frame larger than the chain, cut by the kernel: lost, counted;
		// the chain serves the next frame.
		room := c.writeLen
		if !l.b.cfg.VnetHdr {
			room -= NetHeaderSize
		}
		if uint64(got) > room {
			q.lastAvail--
			l.b.Stats.Dropped.Add(1)
			continue
		}
		written := uint32(NetHeaderSize + got)
		if l.b.cfg.VnetHdr {
			if got < NetHeaderSize {
				q.lastAvail--
				return false, false, fmt.Errorf("reading the port: %d bytes, less than the virtio-net header", got)
			}
			written = uint32(got)
			got -= NetHeaderSize
			setNumBuffers(c.written, 1)
		}
		l.b.Stats.ToVMFrames.Add(1)
		l.b.Stats.ToVMBytes.Add(uint64(got))
		used.put(c.head, written)
	}
}

// The virtio-net header's flags and GSO types (virtio 1.x, 5.1.6).
const (
	hdrNeedsCSum = 1
	gsoNone      = 0
	gsoTCPv4     = 1
	gsoTCPv6     = 4
)

// txHeaderOK tells whether a guest that negotiated features may send a
// frame behind hdr: no flag but NEEDS_CSUM, and that only with CSUM; no
// segmentation but TCP's, each with its HOST_TSO and a checksum to
// finish (no ECN, no UDP). A guest without offloads sends zeros.
func txHeaderOK(hdr [NetHeaderSize]byte, features uint64) bool {
	flags, gso := hdr[0], hdr[1]
	switch {
	case flags&^hdrNeedsCSum != 0:
		return false
	case flags&hdrNeedsCSum != 0 && features&FeatureCSum == 0:
		return false
	case gso == gsoNone:
		return true
	case flags&hdrNeedsCSum == 0:
		return false
	case gso == gsoTCPv4:
		return features&FeatureHostTSO4 != 0
	case gso == gsoTCPv6:
		return features&FeatureHostTSO6 != 0
	}
	return false
}

// setNumBuffers writes the header's num_buffers (bytes 10 and 11 of the
// chain, little-endian) into bufs, across their boundaries.
func setNumBuffers(bufs [][]byte, n uint16) {
	v := [2]byte{byte(n), byte(n >> 8)}
	off := 0 // where the buffer starts in the chain
	for _, b := range bufs {
		for i := 10; i < 12; i++ {
			if i >= off && i < off+len(b) {
				b[i-off] = v[i-10]
			}
		}
		if off += len(b); off >= 12 {
			return
		}
	}
}

// usedChains gives a ring's chains back to the guest: each put, made
// visible (publish) every publishEvery chains and when done.
type usedChains struct {
	l *dataLoop
	q *queue
	n int // chains put
}

// publishEvery is how many chains a loop gives back before it makes them
// visible, mid-batch.
const publishEvery = 64

// used starts giving q's chains back.
func (l *dataLoop) used(q *queue) usedChains { return usedChains{l: l, q: q} }

func (u *usedChains) put(head uint16, written uint32) {
	u.q.ring.putUsed(head, written)
	if u.n++; u.n%publishEvery == 0 {
		u.l.publish(u.q)
	}
}

func (u *usedChains) done() {
	if u.n > 0 {
		u.l.publish(u.q)
	}
}

// publish makes a ring's used entries visible and interrupts the guest
// if it wants to be.
func (l *dataLoop) publish(q *queue) {
	if q.ring.publishUsed() && q.call >= 0 {
		unix.Write(q.call, u64(1))
	}
}

// drainEventfd reads an eventfd's count, if any, without waiting: a VMM
// that made the descriptor blocking again after checkEventfd (the flag is
// its open file's, which the VMM shares) and read the count first does
// not hang the loop (RWF_NOWAIT, which eventfds take since Linux 5.12;
// before, a plain read, non-blocking only while the VMM leaves the flag
// as checkEventfd set it: such a VMM could hang its own helper).
func drainEventfd(fd int) {
	var b [8]byte
	if _, err := unix.Preadv2(fd, [][]byte{b[:]}, -1, unix.RWF_NOWAIT); err == unix.EOPNOTSUPP || err == unix.EINVAL || err == unix.ENOSYS {
		unix.Read(fd, b[:]) // (a kernel before 5.12: the descriptor's own flag, set by checkEventfd)
	}
}

func writev(fd int, iov []unix.Iovec) (int, error) {
	n, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return int(n), e
	}
	return int(n), nil
}

func readv(fd int, iov []unix.Iovec) (int, error) {
	if len(iov) == 0 {
		return 0, unix.EINVAL
	}
	n, _, e := unix.Syscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return int(n), e
	}
	return int(n), nil
}
