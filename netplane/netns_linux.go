package netplane

import (
	"context"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/hostnet"
)

// nsRunner runs functions in a network's namespace, n: at once on a
// thread that is in it already, else on a thread switched to it and back
// (ns.NetNS.Do: a goroutine locked to its thread, two setns and the
// namespaces' files opened, 50 µs on a quiet machine and more on a busy
// one, where a status or a pass asks many times).
//
// Acting on hostnet.ThreadNetNS without locking the thread is safe here
// by this rule, which vmnetctl keeps: every thread that no goroutine is
// locked to is in the process's namespace. A thread is switched only
// with its goroutine locked to it, and switched back before it is
// unlocked (ns.NetNS.Do; the kernel queue's and the probe's threads stay
// locked and end with their goroutine); Go starts a thread from an
// unlocked one or from its template thread, never from a locked one. So
// an unlocked goroutine found in n runs in n wherever it moves next, and
// a locked one does not move.
type nsRunner struct {
	netns ns.NetNS
	id    hostnet.NetNS
}

func newNSRunner(n ns.NetNS) (*nsRunner, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(n.Fd()), &st); err != nil {
		return nil, fmt.Errorf("the network's namespace: %w", err)
	}
	return &nsRunner{netns: n, id: hostnet.NetNS{Dev: st.Dev, Ino: st.Ino}}, nil
}

// in reports whether the calling thread is in the namespace.
func (r *nsRunner) in() bool {
	id, ok := hostnet.ThreadNetNS()
	return ok && id == r.id
}

// do runs f in the namespace.
func (r *nsRunner) do(f func() error) error {
	if r.in() {
		return f()
	}
	return r.netns.Do(func(ns.NetNS) error { return f() })
}

// dial dials from the namespace (the proxy's goroutines run on any
// thread).
func (r *nsRunner) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := r.do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
