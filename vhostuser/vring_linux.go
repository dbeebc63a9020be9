package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Memory is the guest's memory as the VMM shared it: regions, each with
// its bytes mapped here. Every address is translated with bounds checks:
// a range is in one region whole, or refused.
type Memory struct {
	regions []memRegion
}

type memRegion struct {
	Region
	data []byte // Size bytes: the region's, mapped
}

// guest is the n bytes at guest physical address addr, or false.
func (m *Memory) guest(addr, n uint64) ([]byte, bool) { return m.at(addr, n, false) }

// user is the n bytes at the VMM's user address addr, or false.
func (m *Memory) user(addr, n uint64) ([]byte, bool) { return m.at(addr, n, true) }

// at is the n bytes at addr, a guest physical address or (user) one of
// the VMM's, if a region holds them whole.
func (m *Memory) at(addr, n uint64, user bool) ([]byte, bool) {
	for _, r := range m.regions {
		base := r.GuestAddr
		if user {
			base = r.UserAddr
		}
		if addr >= base && addr-base <= r.Size && n <= r.Size-(addr-base) {
			o := addr - base
			return r.data[o : o+n : o+n], true
		}
	}
	return nil, false
}

// Split ring layout (virtio 1.x, 2.7): a descriptor is addr, len, flags,
// next; the available ring flags, idx, ring[num] (and used_event); the
// used ring flags, idx, ring[num] of (id, len) (and avail_event).
const (
	descSize      = 16
	descFNext     = 1
	descFWrite    = 2
	descFIndirect = 4
	usedElemSize  = 8
	// availFNoInterrupt is the guest's "do not interrupt me" flag.
	availFNoInterrupt = 1
)

// errRing is a ring the guest (or its VMM) made wrong: the session ends.
var errRing = errors.New("virtqueue")

// vring is one split virtqueue, its parts mapped from guest memory.
type vring struct {
	mem               *Memory
	num               uint16
	desc, avail, used []byte
	lastAvail         uint16 // the next available entry to take
	usedIdx           uint16 // the next used entry to give
}

// setup maps a ring of num entries at the user addresses of a.
func (q *vring) setup(mem *Memory, num uint16, a VringAddr) error {
	if num == 0 || num&(num-1) != 0 {
		return fmt.Errorf("%w: %d entries, not a power of 2", errRing, num)
	}
	n := uint64(num)
	desc, ok1 := mem.user(a.Desc, n*descSize)
	avail, ok2 := mem.user(a.Avail, 4+2*n+2)
	used, ok3 := mem.user(a.Used, 4+usedElemSize*n+2)
	if !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("%w: ring of %d entries at desc %#x, avail %#x, used %#x is not in the guest's memory", errRing, num, a.Desc, a.Avail, a.Used)
	}
	// Aligned where they are mapped here (the atomics need it), not only
	// at the VMM's addresses: a region at an odd offset would shift them.
	if ptr(desc)%16 != 0 || ptr(avail)%2 != 0 || ptr(used)%4 != 0 {
		return fmt.Errorf("%w: ring misaligned: desc %#x, avail %#x, used %#x", errRing, a.Desc, a.Avail, a.Used)
	}
	q.mem, q.num, q.desc, q.avail, q.used = mem, num, desc, avail, used
	return nil
}

// ready tells whether the ring is mapped.
func (q *vring) ready() bool { return q.desc != nil }

// availIdx reads the guest's available index (after which its entries
// and descriptors are read: an acquiring load).
func (q *vring) availIdx() uint16 {
	return load16(q.avail[2:])
}

// availFlags reads the guest's flags (after the used index was
// published: a full barrier comes first, in publishUsed).
func (q *vring) availFlags() uint16 {
	return load16(q.avail[0:])
}

// chain is a descriptor chain taken from the ring: its head, and its
// buffers in guest memory, those the device reads first, then those it
// writes.
type chain struct {
	head          uint16
	read, written [][]byte
	readLen       uint64
	writeLen      uint64
}

// maxChainLen bounds what a chain may describe (a frame with a 64 KiB
// segment and its header fits many times).
const maxChainLen = 1 << 20

// next takes the next available chain, or false when none is. A chain
// that loops, points past the table, asks for an indirect table (not
// offered), puts a readable buffer after a writable one, or describes
// memory the guest does not have is an error.
func (q *vring) next(c *chain) (bool, error) {
	if q.availIdx() == q.lastAvail {
		return false, nil
	}
	if uint16(q.availIdx()-q.lastAvail) > q.num {
		return false, fmt.Errorf("%w: the guest made %d entries available on a ring of %d", errRing, uint16(q.availIdx()-q.lastAvail), q.num)
	}
	slot := uint64(q.lastAvail % q.num)
	head := binary.LittleEndian.Uint16(q.avail[4+2*slot:])
	q.lastAvail++
	if head >= q.num {
		return false, fmt.Errorf("%w: head descriptor %d on a ring of %d", errRing, head, q.num)
	}
	*c = chain{head: head, read: c.read[:0], written: c.written[:0]}
	i := head
	for n := uint16(0); ; n++ {
		if n >= q.num {
			return false, fmt.Errorf("%w: the chain at %d loops", errRing, head)
		}
		d := q.desc[uint64(i)*descSize:]
		addr, length := binary.LittleEndian.Uint64(d[0:]), binary.LittleEndian.Uint32(d[8:])
		flags, nextIdx := binary.LittleEndian.Uint16(d[12:]), binary.LittleEndian.Uint16(d[14:])
		if flags&descFIndirect != 0 {
			return false, fmt.Errorf("%w: descriptor %d is indirect, which was not offered", errRing, i)
		}
		buf, ok := q.mem.guest(addr, uint64(length))
		if !ok {
			return false, fmt.Errorf("%w: descriptor %d: %d bytes at %#x, not in the guest's memory", errRing, i, length, addr)
		}
		if flags&descFWrite != 0 {
			c.written = append(c.written, buf)
			c.writeLen += uint64(length)
		} else {
			if len(c.written) > 0 {
				return false, fmt.Errorf("%w: descriptor %d is readable after a writable one", errRing, i)
			}
			c.read = append(c.read, buf)
			c.readLen += uint64(length)
		}
		if c.readLen+c.writeLen > maxChainLen {
			return false, fmt.Errorf("%w: the chain at %d describes over %d bytes", errRing, head, maxChainLen)
		}
		if flags&descFNext == 0 {
			return true, nil
		}
		if nextIdx >= q.num {
			return false, fmt.Errorf("%w: descriptor %d's next is %d on a ring of %d", errRing, i, nextIdx, q.num)
		}
		i = nextIdx
	}
}

// putUsed gives chain head back, with written bytes written into it.
// publishUsed makes what putUsed gave visible.
func (q *vring) putUsed(head uint16, written uint32) {
	slot := uint64(q.usedIdx % q.num)
	e := q.used[4+usedElemSize*slot:]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	q.usedIdx++
}

// publishUsed writes the used index after the entries (a releasing
// store), then tells whether the guest wants an interrupt: its flags are
// read after the index is visible (the store is a full barrier on amd64,
// sequentially consistent in Go's model).
func (q *vring) publishUsed() (notify bool) {
	store16(q.used[2:], q.usedIdx)
	return q.availFlags()&availFNoInterrupt == 0
}

// load16 and store16 read and write a ring's little-endian 16-bit field
// at b (2-byte aligned, as the ring's layout is) through the aligned
// 32-bit word that holds it, atomically: Go has no 16-bit atomics.
func load16(b []byte) uint16 {
	word, shift := wordOf(b)
	return uint16(atomic.LoadUint32(word) >> shift)
}

func store16(b []byte, v uint16) {
	word, shift := wordOf(b)
	for {
		old := atomic.LoadUint32(word)
		nw := old&^(0xffff<<shift) | uint32(v)<<shift
		if atomic.CompareAndSwapUint32(word, old, nw) {
			return
		}
	}
}

// ptr is where b starts in this process's memory.
func ptr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// wordOf is the aligned 32-bit word that holds the 16-bit field at b, and
// the field's shift in it (little-endian).
func wordOf(b []byte) (*uint32, uint) {
	p := unsafe.Pointer(&b[0])
	off := uintptr(p) & 3
	return (*uint32)(unsafe.Add(p, -int(off))), uint(off * 8)
}
