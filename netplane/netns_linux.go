package netplane

import (
	"context"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// nsRunner runs functions in a network's namespace, n: at once on a
// thread that is in it already, else on a thread switched to it and back
// (ns.NetNS.Do: a goroutine locked to its thread, two setns and the
// namespaces' files opened, 50 µs on a quiet machine and more on a busy
// one, where a status or a pass asks many times). The controller's
// threads are in its network's namespace unless it made the network in
// another: Go starts a thread from an unlocked one, or from its template
// thread, never from one a Do switched, so a goroutine found on a thread
// in n stays in n wherever it runs next.
type nsRunner struct {
	netns ns.NetNS
	dev   uint64
	ino   uint64
}

func newNSRunner(n ns.NetNS) (*nsRunner, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(n.Fd()), &st); err != nil {
		return nil, fmt.Errorf("the network's namespace: %w", err)
	}
	return &nsRunner{netns: n, dev: st.Dev, ino: st.Ino}, nil
}

// in reports whether the calling thread is in the namespace.
func (r *nsRunner) in() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/thread-self/ns/net", &st) == nil && st.Dev == r.dev && st.Ino == r.ino
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
