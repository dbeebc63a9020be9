package netplane

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A TAP that does not persist goes with the last descriptor of it. The
// kernel takes the link out of its list at once, then, before that close
// returns, waits for whoever may still read it (RCU): 20 ms or more on
// this 2-vCPU machine, most of a helper's exit, and so of every detach,
// which waits for the helper to exit. The controller keeps a copy of the
// descriptor of each TAP it made for a helper (Port.Hold) and, once the
// helper is gone, closes it (HeldPort.Release), waiting only until the
// link is out of the list: the rest of the close goes on in the
// background, a few at a time. If the controller dies, the kernel closes
// its copies: a TAP whose helper still runs stays with the helper's.

// HeldPort is this process's copy of a TAP's descriptor, kept while the
// helper that relays it runs.
type HeldPort struct {
	fd    int
	index uint32
	once  sync.Once
}

// closeSlots bounds the closes under way (each holds a thread while the
// kernel waits); releases beyond them wait for a slot.
var closeSlots = make(chan struct{}, 16)

// heldPorts counts the held ports, which Hold keeps to a quarter of the
// descriptors this process may open.
var heldPorts atomic.Int64

// maxHeld is a quarter of this process's limit of open descriptors.
var maxHeld = sync.OnceValue(func() int64 {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil || l.Cur == unix.RLIM_INFINITY {
		return 4096
	}
	return int64(l.Cur / 4)
})

// Hold keeps a copy of p's descriptor, for Release once p's helper has
// exited. It returns nil, and p's port then goes with the helper's last
// descriptor, for a port that outlives its descriptor (a macvtap, a
// persistent TAP: its cleanup child deletes it), one not attached yet,
// or when this process holds as many as it may.
func (p *Port) Hold() *HeldPort {
	if p.FD < 0 || p.Macvtap || p.reaper != nil || p.Index == 0 {
		return nil
	}
	if heldPorts.Add(1) > maxHeld() {
		heldPorts.Add(-1)
		return nil
	}
	fd, err := unix.FcntlInt(uintptr(p.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		heldPorts.Add(-1)
		return nil
	}
	return &HeldPort{fd: fd, index: p.Index}
}

// Release closes the held copy, once its helper has exited: the TAP, of
// which it is then the last descriptor, goes. It returns when the link is
// out of the kernel's list of links (or the close has returned): a TAP of
// the same name can be made then. The rest of the close goes on after it
// returns. Calls after the first do nothing; nil does nothing.
func (h *HeldPort) Release() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		// Listening before the close: the deletion's message cannot
		// come before.
		gone, watching := deletions.watch(h.index)
		closed := make(chan struct{})
		go func() {
			closeSlots <- struct{}{}
			unix.Close(h.fd)
			<-closeSlots
			heldPorts.Add(-1)
			close(closed)
		}()
		select {
		case <-gone:
		case <-closed:
		}
		if watching {
			deletions.unwatch(h.index, gone)
		}
	})
}

// deletions tells the releases when their links leave the list: one
// netlink socket of the process, in the group of link changes, whose
// reader wakes the release waiting for each deleted index (one socket a
// release cost a `down` of 1,000 VMs half as much again: every socket
// takes every deletion's message).
var deletions linkDeletions

type linkDeletions struct {
	mu      sync.Mutex
	conn    *netlink.Conn
	netns   uint64                     // the namespace conn listens in
	waiters map[uint32][]chan struct{} // by interface index
}

// watch returns a channel closed when the link of index leaves the list,
// and true; or, when it cannot tell (no socket, or this thread is in
// another namespace than the socket), a channel never closed, and false.
func (d *linkDeletions) watch(index uint32) (chan struct{}, bool) {
	ch := make(chan struct{})
	runtime.LockOSThread() // the namespace read is the socket's
	defer runtime.UnlockOSThread()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return ch, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: unix.RTMGRP_LINK})
		if err != nil {
			return ch, false
		}
		d.conn, d.netns, d.waiters = c, st.Ino, map[uint32][]chan struct{}{}
		go d.read(c)
	}
	if d.netns != st.Ino {
		return ch, false
	}
	d.waiters[index] = append(d.waiters[index], ch)
	return ch, true
}

// unwatch forgets ch, a channel of watch(index).
func (d *linkDeletions) unwatch(index uint32, ch chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := slices.DeleteFunc(d.waiters[index], func(c chan struct{}) bool { return c == ch })
	if len(w) == 0 {
		delete(d.waiters, index)
	} else {
		d.waiters[index] = w
	}
}

// read wakes the waiters of each deleted link. On an error (messages
// lost when the socket overflowed) it closes the socket: the waiters then
// learn from their closes, and the next watch opens another.
func (d *linkDeletions) read(c *netlink.Conn) {
	for {
		msgs, err := c.Receive()
		d.mu.Lock()
		if err != nil {
			c.Close()
			if d.conn == c {
				d.conn, d.waiters = nil, nil
			}
			d.mu.Unlock()
			return
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_DELLINK {
				continue
			}
			i := linkIndex(m.Data)
			for _, ch := range d.waiters[i] {
				close(ch)
			}
			delete(d.waiters, i)
		}
		d.mu.Unlock()
	}
}

// linkIndex is the interface index of an RTM_NEWLINK or RTM_DELLINK
// message's data (struct ifinfomsg), 0 if it is too short.
func linkIndex(data []byte) uint32 {
	if len(data) < unix.SizeofIfInfomsg {
		return 0
	}
	return uint32(int32(binary.NativeEndian.Uint32(data[4:8])))
}
