package relay

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr; x/sys/unix has no recvmmsg/sendmmsg wrappers.
// Go pads it to the C size on every architecture (64 bytes on 64-bit).
type mmsghdr struct {
	Hdr unix.Msghdr
	Len uint32
}

// recvmmsg receives up to len(msgs) datagrams; with MSG_DONTWAIT it
// returns EAGAIN when there is none. It does not allocate.
func recvmmsg(fd int, msgs []mmsghdr, flags int) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sendmmsg sends up to len(msgs) datagrams and returns how many were sent;
// an error only when none was.
func sendmmsg(fd int, msgs []mmsghdr, flags int) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// batch is preallocated room for n frames of up to size bytes each, with the
// iovecs and mmsghdrs that point into it.
type batch struct {
	bufs   [][]byte
	iovs   []unix.Iovec
	msgs   []mmsghdr
	mapped []byte // the mapping bufs are in, if mapped
}

// free unmaps the batch's frames; the batch is not used again.
func (b *batch) free() {
	if b.mapped != nil {
		unix.Munmap(b.mapped)
		b.mapped = nil
	}
}

// newBatch is room for n frames of up to size bytes, each after head bytes
// that the iovecs leave out: bufs[i] starts with them (a virtio-net header
// the VM's frames do not have, coalesce.go).
func newBatch(n, size, head int) *batch {
	// The frames' memory is mapped, not Go's: the kernel gives it pages
	// only as frames are written to it (64 frames of 64 KiB with TSO are 4
	// MiB, of which an idle helper touches a few), and the garbage
	// collector neither scans it nor lets it raise the heap's goal, which
	// would keep the setup's garbage resident.
	b := &batch{bufs: make([][]byte, n), iovs: make([]unix.Iovec, n), msgs: make([]mmsghdr, n)}
	slot := head + size
	slab, err := unix.Mmap(-1, 0, n*slot, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err == nil {
		b.mapped = slab
	} else {
		slab = make([]byte, n*slot)
	}
	for i := range n {
		b.bufs[i] = slab[i*slot : (i+1)*slot : (i+1)*slot]
		b.iovs[i].Base = &b.bufs[i][head]
		b.iovs[i].SetLen(size)
		b.msgs[i].Hdr.Iov = &b.iovs[i]
		b.msgs[i].Hdr.SetIovlen(1)
	}
	return b
}
