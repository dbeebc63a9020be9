package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/relay"
)

// Run runs a helper until ctx is done (SIGTERM or SIGINT in the command) or
// the VM's end of the socket goes away, then deletes the VM's port. It
// prints the JSON line on o.Stdout once the interface is ready; when it
// fails before that, stdout stays empty and the error says why.
//
// Its steps are vmnet-helper's: check the options, create the VM's port,
// drop privileges, set up the socket, print the ready line, start the stats
// and forward frames until termination.
func Run(ctx context.Context, o Options) error {
	s, err := checkOptions(&o, "")
	if err != nil {
		return err
	}
	if err := s.openStats(); err != nil {
		return err
	}
	if s.stats.File != nil {
		defer s.stats.File.Close()
	}
	if err := s.openShaping(); err != nil {
		return err
	}
	if s.shaping != nil {
		defer s.shaping.Close()
	}
	if err := s.createPort(); err != nil {
		return err
	}
	defer s.port.Close()
	if o.Attach == AttachTap {
		// The VMM opens the TAP itself, as its owner: the helper only
		// holds it until termination, or until it is gone (relay.Hold),
		// as vmnetctl-relay where it can (execRelay).
		s.port.CloseFD()
		if err := s.dropPrivileges(); err != nil {
			return err
		}
		spec := s.holdSpec()
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		s.log.Infof("main", "holding the TAP in this process: %v", s.execRelay(ctx, stop, spec))
		if ctx.Err() != nil {
			return nil
		}
		if err := s.printReady(); err != nil {
			return err
		}
		return relay.Hold(ctx, spec, s.log, relay.Hooks{Stats: s.stats})
	}
	// Unprivileged from here: the VM's socket is only touched as its owner.
	if err := s.dropPrivileges(); err != nil {
		return err
	}
	if o.Attach == AttachVhostUser {
		return s.serveVhostUser(ctx)
	}
	spec, lis, err := s.setupSocket()
	if err != nil {
		return err
	}
	// Set up: from here the helper only relays, which the small
	// vmnetctl-relay binary does in less memory (execRelay); it prints
	// the ready line. When it cannot, the helper relays itself, with the
	// same code.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	s.log.Infof("main", "relaying in this process: %v", s.execRelay(ctx, stop, spec))
	if ctx.Err() != nil {
		lis.Close()
		s.log.Infof("main", "stopped before a client came")
		return nil
	}
	if err := s.printReady(); err != nil {
		lis.Close()
		return err
	}
	return relay.Serve(ctx, spec, s.log, relay.Hooks{Listener: lis, Relearn: s.relearn(), Stats: s.stats, Shaping: s.shaping})
}

// session is one run of the helper: its options, and what the steps found
// and made.
type session struct {
	o        *Options
	log      *relay.Logger
	id       string // the interface id
	tapName  string
	uid, gid int // the VM owner's, -1 to keep the current ones
	port     *netplane.Port
	// relayOffloads: the port has offloads the VM has not, which the
	// relay does (netplane.Offloads.Relayed, relay.Spec.TapHdr).
	relayOffloads bool
	ready         helperproto.Ready
	stats         *relay.StatsOut // where the stats lines go (openStats)
	shaping       *os.File        // --shaping-file, or nil
	// underController: the helper is the controller's, set up in its
	// process (Prepare), never one run through sudo.
	underController bool
	// cleanup gives the command of the port's cleanup child
	// (netplane.PortConfig.Cleanup): cleanupCommand, or Prepare's.
	cleanup func(index uint32) (*exec.Cmd, error)
	// watch, where set (Prepare's), has the controller's link reaper
	// delete the port instead (netplane.PortConfig.Watch).
	watch func(index uint32) (keep, done *os.File, err error)
}

// openStats opens --stats-file (as root, before the privileges go: the
// controller's helpers dir is not the VM owner's).
func (s *session) openStats() error {
	s.stats = &relay.StatsOut{Log: s.log}
	if s.o.StatsFile == "" {
		return nil
	}
	f, err := os.OpenFile(s.o.StatsFile, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o640)
	if err != nil {
		return fmt.Errorf("--stats-file: %w", err)
	}
	s.stats.File = f
	return nil
}

// openShaping opens --shaping-file (as root, before the privileges go, as
// the stats file).
func (s *session) openShaping() error {
	if s.o.ShapingFile == "" {
		return nil
	}
	f, err := os.OpenFile(s.o.ShapingFile, os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o640)
	if err != nil {
		return fmt.Errorf("--shaping-file: %w", err)
	}
	s.shaping = f
	return nil
}

// checkOptions checks the options, then the cheap things the VM side gave,
// before anything is created: the inherited socket, that the data plane
// runs the network, and the VM's owner. Its first log line names prog as
// what runs ("": this process).
func checkOptions(o *Options, prog string) (*session, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	s := &session{o: o, log: relay.NewLogger(o.Stderr, o.Verbose, o.LogTimestamps)}
	s.cleanup = s.cleanupCommand
	var uname unix.Utsname
	unix.Uname(&uname)
	if prog == "" {
		prog = os.Args[0]
		if exe, err := os.Executable(); err == nil && filepath.Base(exe) != filepath.Base(prog) {
			prog += " (" + exe + ")" // vmnetctl-helper, run as `vmnetctl helper`
		}
	}
	s.log.Infof("main", "running %s on Linux %s", prog, unix.ByteSliceToString(uname.Release[:]))
	if o.FD >= 0 {
		check := relay.CheckFD
		if o.Attach == AttachStream {
			check = relay.CheckStreamFD
		}
		if err := check(o.FD); err != nil {
			return nil, err
		}
		// Our end only: its send buffer bounds what is in flight to the
		// VM; the VMM's end is the VMM's.
		if err := helperproto.SetSocketBuffers(o.FD, o.Offloads()); err != nil {
			s.log.Warnf("main", "--fd %d: %v", o.FD, err)
		}
	}
	if err := checkNetwork(o); err != nil {
		return nil, err
	}
	s.id = o.InterfaceID
	if s.id == "" {
		s.id = api.NewInterfaceID()
	}
	s.tapName = o.TapName
	if s.tapName == "" {
		s.tapName = api.TapName(s.id)
	}
	var err error
	if s.uid, s.gid, err = owner(o.UID, o.GID); err != nil {
		return nil, err
	}
	return s, nil
}

// checkNetwork checks that the data plane runs the network, and that a
// network whose VMs get a macvtap is not asked for what needs a bridge.
func checkNetwork(o *Options) error {
	_, err := netplane.NetworkBridge(o.Network)
	macvtap := errors.Is(err, netplane.ErrMacvtapPort)
	switch {
	case err != nil && !macvtap:
		return err
	case macvtap && o.Attach == AttachTap:
		return fmt.Errorf("%w; --attach tap needs a bridge", err)
	case macvtap && o.Isolation:
		return fmt.Errorf("%w; isolation needs a bridge (bridge mode macvtaps always reach each other)", err)
	}
	return nil
}

// createPort creates the VM's port on the network, privileged: a TAP owned
// by the VM's user on the network's bridge, or a macvtap on a bridged
// network's interface. The data plane makes it; the helper logs it and
// learns the MTU for the ready line.
func (s *session) createPort() error {
	o := s.o
	if !s.underController {
		if err := checkSudoPort(o.Network, s.tapName); err != nil {
			return err
		}
	}
	offloads := netplane.Offloads{Checksum: o.ChecksumOffload, TSO: o.TSO}
	if o.Attach == AttachVhostUser {
		// The guest's virtio-net header goes through to the port as it
		// is; what the port may send follows what the guest takes
		// (serveVhostUser).
		offloads = netplane.Offloads{Checksum: true, TSO: true}
	}
	// A VM without offloads: its port has them, and the relay merges the
	// VM's TCP segments and cuts the host's packets.
	offloads.Relayed = o.Attach == AttachRelay && !o.Offloads() && !o.NoRelayOffloads
	p, err := netplane.CreatePort(o.Network, netplane.PortConfig{
		Name:         s.tapName,
		MAC:          api.InterfaceMAC(s.id),
		UID:          s.uid,
		GID:          s.gid,
		Offloads:     offloads,
		Isolated:     o.Isolation,
		VMMAC:        o.VMMAC,
		NoSpoofCheck: o.NoSpoofCheck,
		Persist:      o.Attach == AttachTap,
		GuardKept:    s.underController,
		Cleanup:      s.cleanup,
		Watch:        s.watch,
	})
	if err != nil {
		return err
	}
	if p.Macvtap {
		s.log.Infof("main", "created macvtap %s on %s of network %q", p.Name, o.Network.Interface, o.Network.ID)
	} else {
		s.log.Infof("main", "created TAP %s on bridge %s of network %q", p.Name, p.Bridge, o.Network.ID)
	}
	if p.MTU > MaxJumboMTU {
		p.Close()
		return fmt.Errorf("network %q has MTU %d; the helper relays frames up to MTU %d", o.Network.ID, p.MTU, MaxJumboMTU)
	}
	s.port = p
	s.relayOffloads = offloads.Relayed && !p.Macvtap
	s.ready = o.ready(s.id, s.tapName, p.MTU)
	s.ready.TapIndex = int(p.Index)
	return nil
}

// cleanupCommand is the port's cleanup child: this executable, still root,
// as `helper --delete-link-on-eof NAME`.
func (s *session) cleanupCommand(uint32) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the helper's executable: %w", err)
	}
	cmd := exec.Command(exe, "helper", "--"+DeleteLinkFlag, s.tapName)
	// Not through sudo (Main refuses the flag so): this helper made the
	// port, and the child is its own.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SUDO_") })
	if f, ok := s.o.Stderr.(*os.File); ok {
		cmd.Stderr = f // (procid.Start takes files only)
	}
	return cmd, nil
}

// dropPrivileges becomes the VM's owner for good.
func (s *session) dropPrivileges() error {
	if err := dropPrivileges(s.uid, s.gid); err != nil {
		return err
	}
	s.log.Infof("main", "running as uid: %d gid: %d", os.Getuid(), os.Getgid())
	return nil
}

// printReady prints the JSON line: the interface is ready.
func (s *session) printReady() error { return printReady(s.o, s.ready) }

// check reports flags that do not go together.
func (o *Options) check() error {
	if o.Network == nil {
		return errors.New("no network to join")
	}
	switch o.Attach {
	case AttachRelay:
		if (o.FD >= 0) == (o.SocketPath != "") {
			return errors.New("exactly one of --fd and --socket is required")
		}
	case AttachStream:
		if (o.FD >= 0) == (o.SocketPath != "") {
			return errors.New("--attach stream serves --socket PATH, a stream socket for the VMM to connect to (qemu -netdev stream, lima's socket:), or --fd N, a VMM's connection handed over: exactly one of them")
		}
		if o.Offloads() {
			return errors.New("--enable-tso and --enable-checksum-offload have no meaning with --attach stream: its frames carry no virtio-net header")
		}
	case AttachVhostUser:
		if o.FD >= 0 || o.SocketPath == "" {
			return errors.New("--attach vhost-user serves --socket PATH, a stream socket for the VMM to connect to (qemu -chardev socket,path=PATH -netdev vhost-user); --fd has no meaning with it")
		}
		if o.Offloads() {
			return errors.New("--enable-tso and --enable-checksum-offload have no meaning with --attach vhost-user: the VMM and the helper negotiate virtio's features themselves")
		}
	case AttachTap:
		if o.FD >= 0 || o.SocketPath != "" {
			return errors.New("--attach tap relays nothing: --fd and --socket have no meaning with it")
		}
		if o.Offloads() {
			return errors.New("--enable-tso and --enable-checksum-offload have no meaning with --attach tap: the VMM sets the TAP's offloads when it opens it")
		}
	default:
		return fmt.Errorf("unknown --attach %q (tap, stream, vhost-user, or leave it out to relay over --fd or --socket)", o.Attach)
	}
	if o.TapName != "" {
		if len(o.TapName) > 15 {
			return fmt.Errorf("--tap %q is longer than 15 characters", o.TapName)
		}
	}
	if o.Network.MTU > MaxJumboMTU {
		return fmt.Errorf("network %q has MTU %d; the helper relays frames up to MTU %d", o.Network.ID, o.Network.MTU, MaxJumboMTU)
	}
	return nil
}

// ready is the JSON line for the interface.
func (o *Options) ready(id, tapName string, mtu int) helperproto.Ready {
	n := o.Network
	max := mtu + ethHeaderLen
	if o.TSO {
		max = TSOMaxPacketSize
	}
	r := helperproto.Ready{
		MACAddress:    api.InterfaceMAC(id),
		MTU:           mtu,
		MaxPacketSize: max,
		InterfaceID:   id,
		StartAddress:  n.Gateway,
		EndAddress:    n.DHCPEnd,
		SubnetMask:    api.SubnetMask(n.Subnet),
		TapName:       tapName,
	}
	if o.Attach == AttachRelay {
		// The most frames one syscall moves, as vmnet reports its own.
		r.ReadMaxPackets, r.WriteMaxPackets = relay.BatchSize, relay.BatchSize
	}
	if n.RoutesIPv6() {
		// vmnet's shared mode reports its NAT66 prefix so: the address alone.
		r.NAT66Prefix = n.Subnet6.Addr().String()
	}
	if o.NetworkFlag {
		r.IPv4Subnet = n.Subnet.Masked().Addr()
		r.IPv4Mask = r.SubnetMask
		if n.HasIPv6() {
			r.IPv6Prefix, r.IPv6PrefixLen = n.Subnet6.Addr().String(), n.Subnet6.Bits()
		}
	}
	return r
}

// printReady writes the JSON line r on o.Stdout.
func printReady(o *Options, r helperproto.Ready) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := o.Stdout.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing the ready line: %w", err)
	}
	return nil
}

// owner completes the VM owner's ids: a uid without gid takes the user's
// primary group.
func owner(uid, gid int) (int, int, error) {
	if uid >= 0 && gid < 0 {
		u, err := user.LookupId(strconv.Itoa(uid))
		if err != nil {
			return 0, 0, fmt.Errorf("--uid %d without --gid: %w", uid, err)
		}
		gid, _ = strconv.Atoi(u.Gid)
	}
	return uid, gid, nil
}

// ownerGroups are the groups a helper run as uid and gid keeps: uid's
// groups, or gid alone.
func ownerGroups(uid, gid int) []int {
	groups := []int{gid}
	if uid >= 0 {
		if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
			if ids, err := u.GroupIds(); err == nil {
				groups = groups[:0]
				for _, s := range ids {
					if g, err := strconv.Atoi(s); err == nil {
						groups = append(groups, g)
					}
				}
			}
		}
	}
	return groups
}

// dropPrivileges becomes the VM's owner for good: supplementary groups, gid,
// then uid (Go applies each to every thread of the process).
func dropPrivileges(uid, gid int) error {
	if uid < 0 && gid < 0 {
		return nil
	}
	if gid >= 0 {
		if err := syscall.Setgroups(ownerGroups(uid, gid)); err != nil {
			return fmt.Errorf("dropping privileges: setgroups: %w", err)
		}
		if err := syscall.Setgid(gid); err != nil {
			return fmt.Errorf("dropping privileges: setgid %d: %w", gid, err)
		}
	}
	if uid >= 0 {
		if err := syscall.Setuid(uid); err != nil {
			return fmt.Errorf("dropping privileges: setuid %d: %w", uid, err)
		}
		if uid != 0 && syscall.Setuid(0) == nil {
			return errors.New("dropping privileges: could become root again")
		}
	}
	return nil
}
