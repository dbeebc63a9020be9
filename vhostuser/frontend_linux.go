package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/relay"
)

// Frontend is the VMM's side of vhost-user, as qemu's vhost-user-net and
// a guest's virtio-net driver make it between them: the guest's memory in
// a memfd it shares, both rings in it with their buffers, kick and call
// eventfds. It is the stand-in of the tests and the benchmark (a VMM
// without a guest: Relay moves frames between the rings and a TAP that
// plays the guest's NIC); the product has no use for it.
type Frontend struct {
	conn  *net.UnixConn
	mem   []byte // the guest's memory, mapped here too
	memFD int
	rings [numQueues]*feRing
	// offloads: the features include OffloadFeatures, the frames carry
	// the guest's virtio-net header as it is, and the buffers hold 64 KiB
	// segments (bufSize).
	offloads bool
	bufSize  uint64
	// GRO, for a session without offloads: received runs of one TCP
	// flow's segments go to the NIC merged, as a guest's GRO merges what
	// its driver takes from the ring before its stack sees it (a Linux
	// guest has it on whatever the device offers). The NIC must have the
	// 12-byte virtio-net header and no offloads (testutil.OpenVnetTAP).
	// Set before Relay.
	GRO    bool
	stop   int           // an eventfd: Close ends Relay
	mu     sync.Mutex    // guards relay and closed
	relay  chan struct{} // closed when Relay returns; nil when none ran
	closed bool
}

// The stand-in's guest memory: one region at feGuestBase (guest
// physical), which its "VMM" has at feUserBase; each ring's parts at
// an offset of feRingsSize a ring, then the buffers, bufSize each
// (feBufSize, or feBigBufSize with offloads).
const (
	feGuestBase  = 0x100000
	feUserBase   = 0x7f0000000000
	feRingNum    = 256
	feBufSize    = 2048
	feBigBufSize = 66 << 10 // a 64 KiB segment, its headers and the virtio-net header
	feRingsSize  = 16 << 10 // a ring's desc, avail and used
	feBufsOff    = numQueues * feRingsSize
)

// feRing is a ring as the guest's driver sees it.
type feRing struct {
	mem                []byte
	bufSize            uint64
	idx                int
	desc, avail, used  uint64 // offsets in mem
	availIdx, lastUsed uint16
	kick, call         int
	free               []uint16            // descriptors not in flight
	inflight           map[uint16][]uint16 // a chain's descriptors, by head
}

// UsedEntry is a chain the backend gave back, and what it wrote into it.
type UsedEntry struct {
	Head uint16
	Len  uint32
}

// Dial connects to the backend at path and sets it up as qemu does: the
// features (VERSION_1, protocol features with REPLY_ACK, and with
// offloads the checksum and TSO offloads both ways if the backend offers
// them), the memory table, both rings, enabled.
func Dial(path string, offloads bool) (f *Frontend, err error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	f = &Frontend{conn: c, memFD: -1, stop: -1, bufSize: feBufSize}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if f.stop, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, err
	}
	if f.memFD, err = unix.MemfdCreate("guest", unix.MFD_CLOEXEC); err != nil {
		return nil, err
	}
	feats, err := f.Call(GetFeatures, nil, nil)
	if err != nil {
		return nil, err
	}
	if len(feats) != 8 || binary.LittleEndian.Uint64(feats)&(FeatureVersion1|FeatureProtocolFeatures) != FeatureVersion1|FeatureProtocolFeatures {
		return nil, fmt.Errorf("GET_FEATURES: %x", feats)
	}
	want := uint64(FeatureVersion1 | FeatureProtocolFeatures)
	if offloads && binary.LittleEndian.Uint64(feats)&OffloadFeatures == OffloadFeatures {
		want |= OffloadFeatures
		f.offloads, f.bufSize = true, feBigBufSize
	}
	size := f.memSize()
	if err := unix.Ftruncate(f.memFD, int64(size)); err != nil {
		return nil, err
	}
	if f.mem, err = unix.Mmap(f.memFD, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, err
	}
	steps := []func() error{
		func() error { return f.Send(SetFeatures, u64(want), nil) },
		func() error { _, err := f.Call(GetProtocolFeatures, nil, nil); return err },
		func() error { return f.Send(SetProtocolFeatures, u64(ProtocolReplyAck), nil) },
		func() error { return f.Send(SetOwner, nil, nil) },
		func() error {
			return f.Ack(SetMemTable, encodeMemTable([]Region{{GuestAddr: feGuestBase, Size: size, UserAddr: feUserBase}}), []int{f.memFD})
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	for q := range numQueues {
		if f.rings[q], err = f.setupRing(q); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// memSize is the guest's memory: the rings, and the buffers of both.
func (f *Frontend) memSize() uint64 {
	return feBufsOff + numQueues*feRingNum*f.bufSize
}

// Offloads tells whether the session has the offloads (Dial's offloads,
// and the backend offered them).
func (f *Frontend) Offloads() bool { return f.offloads }

func (f *Frontend) setupRing(q int) (*feRing, error) {
	off := uint64(q) * feRingsSize
	r := &feRing{mem: f.mem, bufSize: f.bufSize, idx: q, desc: off, avail: off + feRingNum*descSize, inflight: map[uint16][]uint16{}, kick: -1, call: -1}
	r.used = (r.avail + 4 + 2*feRingNum + 2 + 3) &^ 3
	for d := range uint16(feRingNum) {
		r.free = append(r.free, d)
	}
	var err error
	if r.kick, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, err
	}
	if r.call, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		unix.Close(r.kick)
		return nil, err
	}
	f.rings[q] = r // closed with f from here
	for _, m := range []struct {
		r   Request
		p   []byte
		fds []int
	}{
		{SetVringNum, VringState{Index: uint32(q), Num: feRingNum}.encode(), nil},
		{SetVringBase, VringState{Index: uint32(q)}.encode(), nil},
		{SetVringAddr, VringAddr{Index: uint32(q), Desc: feUserBase + r.desc, Avail: feUserBase + r.avail, Used: feUserBase + r.used}.encode(), nil},
		{SetVringKick, u64(uint64(q)), []int{r.kick}},
		{SetVringCall, u64(uint64(q)), []int{r.call}},
	} {
		if err := f.Send(m.r, m.p, m.fds); err != nil {
			return nil, err
		}
	}
	return r, f.Ack(SetVringEnable, VringState{Index: uint32(q), Num: 1}.encode(), nil)
}

// Close ends the session, and Relay if it runs, and frees the memory.
func (f *Frontend) Close() {
	f.mu.Lock()
	f.closed = true
	running := f.relay
	f.mu.Unlock()
	if running != nil {
		unix.Write(f.stop, u64(1))
		<-running
	}
	if f.stop >= 0 {
		unix.Close(f.stop)
	}
	f.conn.Close()
	if f.mem != nil {
		unix.Munmap(f.mem)
	}
	if f.memFD >= 0 {
		unix.Close(f.memFD)
	}
	for _, r := range f.rings {
		if r != nil {
			unix.Close(r.kick)
			unix.Close(r.call)
		}
	}
}

// Send writes a message with fds.
func (f *Frontend) Send(r Request, payload []byte, fds []int) error {
	return f.SendFlags(r, flagVersion, payload, fds)
}

// SendFlags writes a message with its flags.
func (f *Frontend) SendFlags(r Request, flags uint32, payload []byte, fds []int) error {
	msg := append(Header{Request: r, Flags: flags, Size: uint32(len(payload))}.encode(), payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := f.conn.WriteMsgUnix(msg, oob, nil); err != nil {
		return fmt.Errorf("%s: %w", r, err)
	}
	return nil
}

// reply reads the reply to r.
func (f *Frontend) reply(r Request) ([]byte, error) {
	f.conn.SetReadDeadline(time.Now().Add(time.Minute))
	defer f.conn.SetReadDeadline(time.Time{})
	h, p, fds, err := readMessage(f.conn)
	closeFDs(fds)
	if err != nil {
		return nil, fmt.Errorf("%s's reply: %w", r, err)
	}
	if h.Request != r || h.Flags&flagReply == 0 {
		return nil, fmt.Errorf("%s's reply: %+v", r, h)
	}
	return p, nil
}

// Call sends r and returns its reply's payload.
func (f *Frontend) Call(r Request, payload []byte, fds []int) ([]byte, error) {
	if err := f.Send(r, payload, fds); err != nil {
		return nil, err
	}
	return f.reply(r)
}

// Ack sends r wanting a reply (REPLY_ACK), which must be 0.
func (f *Frontend) Ack(r Request, payload []byte, fds []int) error {
	if err := f.SendFlags(r, flagVersion|flagNeedReply, payload, fds); err != nil {
		return err
	}
	p, err := f.reply(r)
	if err == nil && (len(p) != 8 || binary.LittleEndian.Uint64(p) != 0) {
		err = fmt.Errorf("%s: acked %x", r, p)
	}
	return err
}

// bufOff is the offset of descriptor d's buffer.
func (r *feRing) bufOff(d uint16) uint64 {
	return feBufsOff + (uint64(r.idx)*feRingNum+uint64(d))*r.bufSize
}

// putDesc writes descriptor d.
func (r *feRing) putDesc(d uint16, addr uint64, length uint32, flags, next uint16) {
	b := r.mem[r.desc+uint64(d)*descSize:]
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// offer makes the chains at heads available and kicks once.
func (r *feRing) offer(heads ...uint16) {
	for _, h := range heads {
		slot := r.avail + 4 + 2*uint64(r.availIdx%feRingNum)
		binary.LittleEndian.PutUint16(r.mem[slot:], h)
		r.availIdx++
	}
	store16(r.mem[r.avail+2:], r.availIdx)
	unix.Write(r.kick, u64(1))
}

// take is a free descriptor, if one is.
func (r *feRing) take() (uint16, bool) {
	if len(r.free) == 0 {
		return 0, false
	}
	d := r.free[0]
	r.free = r.free[1:]
	return d, true
}

// usedNow is what the backend used since the last call, without waiting.
func (r *feRing) usedNow(out []UsedEntry) []UsedEntry {
	idx := load16(r.mem[r.used+2:])
	for r.lastUsed != idx {
		e := r.mem[r.used+4+8*uint64(r.lastUsed%feRingNum):]
		out = append(out, UsedEntry{uint16(binary.LittleEndian.Uint32(e)), binary.LittleEndian.Uint32(e[4:])})
		r.lastUsed++
	}
	return out
}

// release frees the descriptors of chains the backend used.
func (r *feRing) release(used []UsedEntry) {
	for _, u := range used {
		r.free = append(r.free, r.inflight[u.Head]...)
		delete(r.inflight, u.Head)
	}
}

// postRX offers n receive buffers of feBufSize (fewer if fewer are free).
func (r *feRing) postRX(n int) {
	var heads []uint16
	for range n {
		d, ok := r.take()
		if !ok {
			break
		}
		r.putDesc(d, feGuestBase+r.bufOff(d), uint32(r.bufSize), descFWrite, 0)
		r.inflight[d] = []uint16{d}
		heads = append(heads, d)
	}
	if len(heads) > 0 {
		r.offer(heads...)
	}
}

// Relay moves frames between the rings and tap, a TAP that plays the
// guest's NIC, until an error or Close: what the NIC sends goes out on the
// TX ring, one buffer a frame after its header; what the backend puts in
// the RX buffers goes to the NIC, and the buffers are offered again.
// Without offloads the TAP has no virtio-net header (but with GRO, where
// it has one that asks for nothing, and merged runs behind one that asks
// for TSO), and frames over a buffer (an MTU over 2 KiB) are not carried;
// with them (Offloads) it has the 12-byte header (IFF_VNET_HDR,
// TUNSETVNETHDRSZ 12) and the TSO the guest's driver would give it, and
// the header goes through as is.
func (f *Frontend) Relay(tap int) error {
	done := make(chan struct{})
	f.mu.Lock()
	if f.closed || f.relay != nil {
		f.mu.Unlock()
		return errors.New("the frontend is closed, or relays already")
	}
	f.relay = done
	f.mu.Unlock()
	defer close(done)
	if err := unix.SetNonblock(tap, true); err != nil {
		return err
	}
	tx, rx := f.rings[txQueue], f.rings[rxQueue]
	rx.postRX(feRingNum)
	var used []UsedEntry
	var heads []uint16
	var batch [][]byte
	gro := f.GRO && !f.offloads
	co := relay.NewCoalescer()
	for {
		// Sent chains back.
		used = tx.usedNow(used[:0])
		tx.release(used)
		// Received frames to the NIC, their buffers offered again.
		used = rx.usedNow(used[:0])
		heads, batch = heads[:0], batch[:0]
		for _, u := range used {
			if u.Len > NetHeaderSize && uint64(u.Len) <= rx.bufSize {
				at := rx.bufOff(u.Head)
				switch {
				case f.offloads:
					unix.Write(tap, f.mem[at:at+uint64(u.Len)])
				case gro:
					b := f.mem[at : at+uint64(u.Len)]
					clear(b[:NetHeaderSize]) // (Coalescer.Write: each frame behind a zero header)
					batch = append(batch, b)
				default:
					unix.Write(tap, f.mem[at+NetHeaderSize:at+uint64(u.Len)])
				}
			}
			heads = append(heads, u.Head)
		}
		if len(batch) > 0 {
			co.Write(batch, func(p []byte) bool {
				_, err := unix.Write(tap, p)
				return err == nil
			})
		}
		if len(heads) > 0 {
			rx.offer(heads...)
		}
		// The NIC's frames out, while buffers are free.
		heads = heads[:0]
		for {
			d, ok := tx.take()
			if !ok {
				break
			}
			at := tx.bufOff(d)
			buf := f.mem[at : at+tx.bufSize]
			frame := buf[NetHeaderSize:]
			if f.offloads || gro {
				frame = buf // the NIC's header, then its frame
			}
			n, err := unix.Read(tap, frame)
			if err != nil || n <= 0 {
				tx.free = append(tx.free, d)
				if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
					return fmt.Errorf("reading the NIC: %w", err)
				}
				break
			}
			if !f.offloads {
				clear(buf[:NetHeaderSize]) // no offloads: a header that asks nothing
				if !gro {
					n += NetHeaderSize // (the NIC gave the frame alone)
				}
			}
			tx.putDesc(d, feGuestBase+at, uint32(n), 0, 0)
			tx.inflight[d] = []uint16{d}
			heads = append(heads, d)
		}
		if len(heads) > 0 {
			tx.offer(heads...)
		}
		pfds := []unix.PollFd{{Fd: int32(f.stop), Events: unix.POLLIN}, {Fd: int32(rx.call), Events: unix.POLLIN}, {Fd: int32(tx.call), Events: unix.POLLIN}}
		if len(tx.free) > 0 {
			pfds = append(pfds, unix.PollFd{Fd: int32(tap), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(pfds, 1000); err != nil && err != unix.EINTR {
			return err
		}
		if pfds[0].Revents != 0 {
			return nil
		}
		drainEventfd(rx.call)
		drainEventfd(tx.call)
	}
}
