package netplane

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/hostnet"
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
	netns hostnet.NetNS // the namespace the TAP is in: an index is the namespace's
	once  sync.Once
}

// closeSlots bounds the closes under way (each holds a thread while the
// kernel waits); a release that finds none free within slotWait closes
// all the same (a close the kernel never ends must not hold every later
// detach).
var closeSlots = make(chan struct{}, 16)

const slotWait = 100 * time.Millisecond

// lingerWait bounds Release's wait for a link that another copy of its
// descriptor keeps after the held one is closed.
const lingerWait = 10 * time.Second

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
	// (The controller's threads are all in its namespace but for a
	// moment inside ns.Do, which locks its thread.)
	netns, _ := hostnet.ThreadNetNS()
	return &HeldPort{fd: fd, index: p.Index, netns: netns}
}

// Release closes the held copy, once its helper has exited: the TAP, of
// which it is then the last descriptor, goes. It returns when the link is
// out of the kernel's list of links: a TAP of the same name can be made
// then. The rest of the close goes on after it returns. The copy may not
// be the last a moment longer: a child this process forks holds copies of
// its descriptors until its exec closes them; the link goes then, which
// Release waits for. Calls after the first do nothing; nil does nothing.
func (h *HeldPort) Release() {
	if h == nil {
		return
	}
	h.once.Do(func() {
		// Listening before the close: the deletion's message cannot
		// come before.
		w := deletions.watch(h.netns, h.index)
		closed := make(chan struct{})
		go func() {
			t := time.NewTimer(slotWait)
			select {
			case closeSlots <- struct{}{}:
				defer func() { <-closeSlots }()
			case <-t.C:
			}
			t.Stop()
			unix.Close(h.fd)
			heldPorts.Add(-1)
			close(closed)
		}()
		if w == nil {
			<-closed
			return
		}
		defer deletions.unwatch(w)
		select {
		case <-w.gone:
			return
		case <-w.lost:
		case <-closed:
		}
		// The close returned, or the socket lost messages: the link is
		// gone, or another copy (a child's, until its exec) keeps it a
		// moment longer. One that keeps it longer than lingerWait is
		// not waited for: the next TAP of the name meets it
		// (tapClash), as it would have met the helper's.
		deadline := time.Now().Add(lingerWait)
		for look := time.Millisecond; linkListed(h.index) && time.Now().Before(deadline); look = min(2*look, 50*time.Millisecond) {
			select {
			case <-w.gone:
				return
			case <-time.After(look):
			}
		}
	})
}

// linkListed reports whether a link of index is in the calling thread's
// namespace (the releases run in the controller's).
func linkListed(index uint32) bool {
	_, err := netlink.LinkByIndex(int(index))
	return err == nil
}

// deletions tells the releases when their links leave the list: one
// netlink socket a namespace, in the group of link changes, whose reader
// wakes the release waiting for each deleted index (one socket a release
// cost a `down` of 1,000 VMs half as much again: every socket takes
// every deletion's message).
var deletions linkDeletions

type linkDeletions struct {
	mu sync.Mutex
	ns map[hostnet.NetNS]*nsDeletions
}

// nsDeletions is the socket of one namespace and who waits on it.
type nsDeletions struct {
	conn    *mdnetlink.Conn
	lost    chan struct{}               // closed when the reader stopped
	waiters map[uint32][]*deletionWatch // by interface index
}

// deletionWatch is one release's wait: gone is closed when the link
// leaves the list; lost when no message can tell any more.
type deletionWatch struct {
	index      uint32
	gone, lost chan struct{}
	d          *nsDeletions
}

// watch starts a wait for the deletion of link index of namespace netns:
// nil when it cannot be told from here (no socket, or this thread is not
// in that namespace).
func (d *linkDeletions) watch(netns hostnet.NetNS, index uint32) *deletionWatch {
	runtime.LockOSThread() // the namespace read is the socket's
	defer runtime.UnlockOSThread()
	if here, ok := hostnet.ThreadNetNS(); !ok || netns == (hostnet.NetNS{}) || here != netns {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.ns[netns]
	if n == nil {
		c, err := mdnetlink.Dial(unix.NETLINK_ROUTE, &mdnetlink.Config{Groups: unix.RTMGRP_LINK})
		if err != nil {
			return nil
		}
		n = &nsDeletions{conn: c, lost: make(chan struct{}), waiters: map[uint32][]*deletionWatch{}}
		if d.ns == nil {
			d.ns = map[hostnet.NetNS]*nsDeletions{}
		}
		d.ns[netns] = n
		go d.read(netns, n)
	}
	w := &deletionWatch{index: index, gone: make(chan struct{}), lost: n.lost, d: n}
	n.waiters[index] = append(n.waiters[index], w)
	return w
}

// unwatch ends w.
func (d *linkDeletions) unwatch(w *deletionWatch) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ws := slices.DeleteFunc(w.d.waiters[w.index], func(x *deletionWatch) bool { return x == w })
	if len(ws) == 0 {
		delete(w.d.waiters, w.index)
	} else {
		w.d.waiters[w.index] = ws
	}
}

// read wakes the waiters of each deleted link. On an error (messages
// lost when the socket overflowed) it closes the socket and tells its
// waiters (lost), who look for their links themselves; the next watch
// opens another socket.
func (d *linkDeletions) read(netns hostnet.NetNS, n *nsDeletions) {
	for {
		msgs, err := n.conn.Receive()
		d.mu.Lock()
		if err != nil {
			n.conn.Close()
			close(n.lost)
			if d.ns[netns] == n {
				delete(d.ns, netns)
			}
			d.mu.Unlock()
			return
		}
		for _, m := range msgs {
			// A link's own deletion (AF_UNSPEC): a bridge port's leaving
			// the bridge comes as AF_BRIDGE with the port's index.
			if m.Header.Type != unix.RTM_DELLINK || len(m.Data) == 0 || m.Data[0] != unix.AF_UNSPEC {
				continue
			}
			i := linkIndex(m.Data)
			for _, w := range n.waiters[i] {
				close(w.gone)
			}
			delete(n.waiters, i)
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
