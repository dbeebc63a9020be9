package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/spec"
)

// A network's stream socket (`socket: true`): socket_vmnet's way, which
// lima's `socket:` networks use. Any VMM that connects to
// STATE/networks/ID.sock (qemu -netdev stream,server=off) gets a port of
// its own on the network: the controller hands the connection to a helper
// (`vmnetctl helper --attach stream --fd 3`), whose TAP is guarded as any
// VM's, its MAC learned (one no other port holds or expects), and which
// ends when the VMM goes. Such a port belongs to no VM file: it has no
// name, reservation or forward, and a controller that restarts stops it
// (its VMM reconnects, with qemu's reconnect option, and gets a new one).

// netSocket is the server of one network's stream socket.
type netSocket struct {
	ln      *net.UnixListener
	path    string
	mu      sync.Mutex
	clients map[*helperexec.Helper]bool
	wg      sync.WaitGroup
	served  atomic.Uint64
}

// ensureNetSockets serves the stream socket of every running network that
// has one, and stops those of the others. Call with c.mu held.
func (c *Controller) ensureNetSockets(desired *spec.Desired) []error {
	want := map[string]*api.Network{}
	for _, n := range desired.Networks {
		if n.Socket && c.nets[n.ID] != nil {
			want[n.ID] = n
		}
	}
	for id, s := range c.netSockets {
		if want[id] == nil {
			s.close()
			delete(c.netSockets, id)
		}
	}
	var errs []error
	for id, n := range want {
		if c.netSockets[id] != nil {
			continue
		}
		s, err := c.serveNetSocket(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("network %q: its stream socket: %w", id, err))
			continue
		}
		if c.netSockets == nil {
			c.netSockets = map[string]*netSocket{}
		}
		c.netSockets[id] = s
	}
	return errs
}

// serveNetSocket listens on n's stream socket and hands each connection to
// a helper of its own.
func (c *Controller) serveNetSocket(n *api.Network) (*netSocket, error) {
	path := c.sd.NetworkSocketPath(n.ID)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	os.Remove(path) // a stale one, from a controller that was killed
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	// Root's, and the API socket's group's (serve --group): the VMMs of
	// the users who may use the controller.
	mode := os.FileMode(0o600)
	if gid, ok := c.apiGroup(); ok {
		if err := os.Chown(path, 0, gid); err == nil {
			mode = 0o660
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	s := &netSocket{ln: ln, path: path, clients: map[*helperexec.Helper]bool{}}
	l := c.launcher() // (read under c.mu, which the accepts do not take)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if err := c.startSocketClient(l, n, s, conn); err != nil {
				c.log.Warn("a VMM on the network's stream socket: no port", "network", n.ID, "err", err)
			}
			conn.Close() // the helper holds its copy
		}
	}()
	c.log.Info("serving the network's stream socket", "network", n.ID, "path", path)
	return s, nil
}

// startSocketClient starts the helper of one VMM's connection to s.
func (c *Controller) startSocketClient(l launch.Launcher, n *api.Network, s *netSocket, conn *net.UnixConn) error {
	f, err := conn.File()
	if err != nil {
		return err
	}
	defer f.Close()
	k := s.served.Add(1)
	// A name of its own, for its TAP and log: the socket's, and the
	// connection's number.
	a := &api.Attachment{VM: fmt.Sprintf("socket-%s-%d", n.ID, k), Network: n.ID, Attach: api.AttachStream}
	spec := backend.HelperSpec{Executable: l.Executable, Attachment: a, Network: n, UID: -1, GID: -1, FD: launch.InheritedFD,
		NetworksFile: l.StateDir.NetworksYAML(), VMNetHelperPath: l.VMNetHelperPath, StatsInterval: l.StatsInterval, Owner: l.StateDir.Path}
	argv, err := l.Backend.HelperCommand(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.StateDir.HelpersDir(), 0o750); err != nil {
		return err
	}
	cmd := launch.Command(l.Backend, argv)
	cmd.Env = launch.HelperEnv(l.Backend.HelperEnv(spec))
	cmd.ExtraFiles = []*os.File{f}
	key := a.VM + "/0"
	proc, err := helperexec.Start(context.Background(), cmd, helperexec.StartOptions{StallTimeout: l.StallTimeout,
		StopGrace: l.StopGrace, ReadyFile: l.StateDir.HelperReadyFile(key), LogFile: l.StateDir.HelperLogFile(key)})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.clients[proc] = true
	s.mu.Unlock()
	c.log.Info("a VMM on the network's stream socket", "network", n.ID, "port", proc.Ready.TapName, "pid", proc.Pid())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		proc.Wait()
		s.mu.Lock()
		delete(s.clients, proc)
		s.mu.Unlock()
		os.Remove(l.StateDir.HelperReadyFile(key))
	}()
	return nil
}

// close stops serving the socket and stops its clients' helpers.
func (s *netSocket) close() {
	s.ln.Close()
	s.mu.Lock()
	var clients []*helperexec.Helper
	for h := range s.clients {
		clients = append(clients, h)
	}
	s.mu.Unlock()
	for _, h := range clients {
		h.Stop()
	}
	s.wg.Wait()
}

// apiGroup is the gid of the API socket's group (serve --group), if any.
func (c *Controller) apiGroup() (int, bool) {
	if c.opts.Group == "" {
		return 0, false
	}
	gid, err := lookupGroup(c.opts.Group)
	return gid, err == nil
}
