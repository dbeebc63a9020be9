package helper

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
	"github.com/vmnetctl/vmnetctl/vhostuser"
)

// serveVhostUser is --attach vhost-user, once the port is made and the
// privileges dropped: --socket is a stream socket the VMM connects to,
// and package vhostuser moves the frames between the guest's rings and
// the port, in this process, until ctx ends; a VMM that goes leaves the
// socket to the next (a restarted VMM reconnects).
func (s *session) serveVhostUser(ctx context.Context) error {
	if s.port.Macvtap {
		return fmt.Errorf("--attach vhost-user needs a TAP on a bridge; network %q's interface %s gives a macvtap", s.o.Network.ID, s.o.Network.Interface)
	}
	lis, err := relay.ListenStream(s.o.SocketPath)
	if err != nil {
		return err
	}
	defer lis.Close()
	fd, err := unix.Dup(lis.FD())
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), s.o.SocketPath)
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("--socket %s: %w", s.o.SocketPath, err)
	}
	defer l.Close()
	port := s.port.FD
	cfg := vhostuser.Config{Port: port, VnetHdr: true, Logf: func(format string, args ...any) {
		s.log.Infof("vhost-user", format, args...)
	}}
	// The TAP sends the guest only segments and partial checksums it
	// takes (netplane made it with every offload on).
	cfg.SetOffloads = func(csum, tso4, tso6 bool) error {
		flags := 0
		if csum {
			flags |= unix.TUN_F_CSUM
			if tso4 {
				flags |= unix.TUN_F_TSO4
			}
			if tso6 {
				flags |= unix.TUN_F_TSO6
			}
		}
		return unix.IoctlSetInt(port, unix.TUNSETOFFLOAD, flags)
	}
	if s.o.Verbose {
		cfg.Debugf = func(format string, args ...any) { s.log.Debugf("vhost-user", format, args...) }
	}
	cfg.Shaped = s.shaping != nil
	b := vhostuser.New(cfg)
	defer b.Close()
	if s.shaping != nil {
		defer relay.FollowShapings(s.shaping, s.log, b.Shape)()
	}
	if err := s.printReady(); err != nil {
		return err
	}
	s.log.Infof("main", "serving vhost-user on %q", s.o.SocketPath)
	stop := vhostStats(b, s.o.StatsInterval, s.stats)
	defer stop()
	return b.Serve(ctx, l.(*net.UnixListener))
}

// vhostStats emits b's stats every interval (never with 0), and once
// more when stopped, as the relay does its own.
func vhostStats(b *vhostuser.Backend, interval time.Duration, out *relay.StatsOut) (stop func()) {
	emit := func(last bool) {
		st := &b.Stats
		out.Emit(helperproto.Stats{Time: time.Now(),
			Host: helperproto.Counters{Packets: st.ToVMFrames.Load(), Bytes: st.ToVMBytes.Load(), Drops: st.Dropped.Load()},
			VM:   helperproto.Counters{Packets: st.FromVMFrames.Load(), Bytes: st.FromVMBytes.Load(), Drops: st.FromVMRefused.Load()}}, last)
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		if interval <= 0 {
			<-done
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				emit(false)
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		<-ended
		emit(true)
	}
}
