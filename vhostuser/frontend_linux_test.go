package vhostuser

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// frontend is a VMM's side of vhost-user, as qemu's vhost-user-net does
// it: the guest's memory in a memfd it shares, the rings in it, kick and
// call eventfds; and the guest driver's side of the rings, which posts
// buffers and reads what the device used.
type frontend struct {
	t    testing.TB
	conn *net.UnixConn
	mem  []byte // the guest's memory, mapped here too
	fd   int    // its memfd
	q    [numQueues]*guestRing
}

// The guest's memory as the stand-in lays it out: one region at guestBase
// (guest physical), which the VMM maps at userBase; each ring's parts at
// ringOff(q), then the buffers, bufSize each.
const (
	guestBase = 0x100000
	userBase  = 0x7f0000000000
	memSize   = 4 << 20
	ringNum   = 256
	bufSize   = 2048
	ringsSize = 16 << 10 // a ring's desc, avail and used
	bufsOff   = numQueues * ringsSize
)

// guestRing is a ring as the guest driver sees it.
type guestRing struct {
	f                  *frontend
	idx                int
	desc, avail, used  uint64 // offsets in mem
	availIdx, lastUsed uint16
	kick, call         int
	free               []uint16            // descriptors not in flight
	inflight           map[uint16][]uint16 // a chain's descriptors, by head
}

func ringOff(q int) uint64 { return uint64(q) * ringsSize }

func bufOff(q int, d uint16) uint64 {
	return bufsOff + (uint64(q)*ringNum+uint64(d))*bufSize
}

// connect makes a frontend and sets the backend up on socket path: the
// features, the memory table, both rings, enabled.
func connect(t testing.TB, path string) *frontend {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.MemfdCreate("guest", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, memSize); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	f := &frontend{t: t, conn: c, mem: mem, fd: fd}
	t.Cleanup(f.close)
	if got := binary.LittleEndian.Uint64(f.call(GetFeatures, nil, nil)); got&FeatureVersion1 == 0 || got&FeatureProtocolFeatures == 0 {
		t.Fatalf("GET_FEATURES: %#x", got)
	}
	f.send(SetFeatures, u64(FeatureVersion1|FeatureProtocolFeatures), nil)
	f.call(GetProtocolFeatures, nil, nil)
	f.send(SetProtocolFeatures, u64(ProtocolReplyAck), nil)
	f.send(SetOwner, nil, nil)
	f.ack(SetMemTable, encodeMemTable([]Region{{GuestAddr: guestBase, Size: memSize, UserAddr: userBase}}), []int{fd})
	for q := range numQueues {
		f.q[q] = f.setupRing(q)
	}
	return f
}

func (f *frontend) setupRing(q int) *guestRing {
	r := &guestRing{f: f, idx: q, desc: ringOff(q), avail: ringOff(q) + ringNum*descSize, inflight: map[uint16][]uint16{}}
	r.used = (r.avail + 4 + 2*ringNum + 2 + 3) &^ 3
	for d := range uint16(ringNum) {
		r.free = append(r.free, d)
	}
	var err error
	if r.kick, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		f.t.Fatal(err)
	}
	if r.call, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		f.t.Fatal(err)
	}
	f.send(SetVringNum, VringState{Index: uint32(q), Num: ringNum}.encode(), nil)
	f.send(SetVringBase, VringState{Index: uint32(q)}.encode(), nil)
	f.send(SetVringAddr, VringAddr{Index: uint32(q), Desc: userBase + r.desc, Avail: userBase + r.avail, Used: userBase + r.used}.encode(), nil)
	f.send(SetVringKick, u64(uint64(q)), []int{r.kick})
	f.send(SetVringCall, u64(uint64(q)), []int{r.call})
	f.ack(SetVringEnable, VringState{Index: uint32(q), Num: 1}.encode(), nil)
	return r
}

func (f *frontend) close() {
	f.conn.Close()
	unix.Munmap(f.mem)
	unix.Close(f.fd)
	for _, r := range f.q {
		if r != nil {
			unix.Close(r.kick)
			unix.Close(r.call)
		}
	}
}

// send writes a message with fds.
func (f *frontend) send(r Request, payload []byte, fds []int) {
	f.sendFlags(r, flagVersion, payload, fds)
}

func (f *frontend) sendFlags(r Request, flags uint32, payload []byte, fds []int) {
	f.t.Helper()
	msg := append(Header{Request: r, Flags: flags, Size: uint32(len(payload))}.encode(), payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := f.conn.WriteMsgUnix(msg, oob, nil); err != nil {
		f.t.Fatalf("%s: %v", r, err)
	}
}

// reply reads a reply to r.
func (f *frontend) reply(r Request) []byte {
	f.t.Helper()
	f.conn.SetReadDeadline(time.Now().Add(time.Minute))
	h, p, fds, err := readMessage(f.conn)
	if err != nil {
		f.t.Fatalf("%s's reply: %v", r, err)
	}
	closeFDs(fds)
	if h.Request != r || h.Flags&flagReply == 0 {
		f.t.Fatalf("%s's reply: %+v", r, h)
	}
	return p
}

// call sends r and returns the reply's payload.
func (f *frontend) call(r Request, payload []byte, fds []int) []byte {
	f.t.Helper()
	f.send(r, payload, fds)
	return f.reply(r)
}

// ack sends r wanting a reply (REPLY_ACK), and fails unless it is 0.
func (f *frontend) ack(r Request, payload []byte, fds []int) {
	f.t.Helper()
	f.sendFlags(r, flagVersion|flagNeedReply, payload, fds)
	if p := f.reply(r); len(p) != 8 || binary.LittleEndian.Uint64(p) != 0 {
		f.t.Fatalf("%s: acked %x", r, p)
	}
}

// putDesc writes descriptor d.
func (r *guestRing) putDesc(d uint16, addr uint64, length uint32, flags, next uint16) {
	b := r.f.mem[r.desc+uint64(d)*descSize:]
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// offer makes the chain at head available and kicks.
func (r *guestRing) offer(heads ...uint16) {
	for _, h := range heads {
		slot := r.avail + 4 + 2*uint64(r.availIdx%ringNum)
		binary.LittleEndian.PutUint16(r.f.mem[slot:], h)
		r.availIdx++
	}
	store16(r.f.mem[r.avail+2:], r.availIdx)
	unix.Write(r.kick, u64(1))
}

// take is a free descriptor.
func (r *guestRing) take() uint16 {
	if len(r.free) == 0 {
		r.f.t.Fatal("the guest's ring is full")
	}
	d := r.free[0]
	r.free = r.free[1:]
	return d
}

// usedEntry is a chain the device gave back.
type usedEntry struct {
	head uint16
	len  uint32
}

// waitUsed waits (polling its call eventfd, with a deadline) until the
// device used n more chains, and returns them.
func (r *guestRing) waitUsed(n int) []usedEntry {
	r.f.t.Helper()
	var out []usedEntry
	deadline := time.Now().Add(time.Minute)
	for len(out) < n {
		for load16(r.f.mem[r.used+2:]) != r.lastUsed && len(out) < n {
			e := r.f.mem[r.used+4+8*uint64(r.lastUsed%ringNum):]
			out = append(out, usedEntry{uint16(binary.LittleEndian.Uint32(e)), binary.LittleEndian.Uint32(e[4:])})
			r.lastUsed++
		}
		if len(out) >= n {
			break
		}
		if time.Now().After(deadline) {
			r.f.t.Fatalf("ring %d: %d of %d chains used within a minute", r.idx, len(out), n)
		}
		pfd := []unix.PollFd{{Fd: int32(r.call), Events: unix.POLLIN}}
		unix.Poll(pfd, 100)
		drainEventfd(r.call)
	}
	return out
}

// send sends frame from the guest: header and frame in two descriptors.
func (r *guestRing) sendFrame(frame []byte) uint16 {
	h, d := r.take(), r.take()
	hdrAt, frameAt := bufOff(r.idx, h), bufOff(r.idx, d)
	clear(r.f.mem[hdrAt : hdrAt+NetHeaderSize])
	copy(r.f.mem[frameAt:], frame)
	r.putDesc(h, guestBase+hdrAt, NetHeaderSize, descFNext, d)
	r.putDesc(d, guestBase+frameAt, uint32(len(frame)), 0, 0)
	r.inflight[h] = []uint16{h, d}
	return h
}

// release frees the descriptors of the chains the device used.
func (r *guestRing) release(used []usedEntry) {
	for _, u := range used {
		r.free = append(r.free, r.inflight[u.head]...)
		delete(r.inflight, u.head)
	}
}

// postRX offers n receive buffers of bufSize.
func (r *guestRing) postRX(n int) {
	var heads []uint16
	for range n {
		d := r.take()
		r.putDesc(d, guestBase+bufOff(r.idx, d), bufSize, descFWrite, 0)
		r.inflight[d] = []uint16{d}
		heads = append(heads, d)
	}
	r.offer(heads...)
}

// frame is a test frame of size bytes, numbered i.
func frame(i, size int) []byte {
	f := make([]byte, size)
	copy(f, []byte{0x52, 0x55, 0x55, 0, 0, 1, 0x52, 0x55, 0x55, 0, 0, 2, 0x08, 0x00})
	binary.BigEndian.PutUint32(f[14:], uint32(i))
	for j := 18; j < size; j++ {
		f[j] = byte(i + j)
	}
	return f
}

func (f *frontend) String() string { return fmt.Sprintf("frontend on %s", f.conn.RemoteAddr()) }
