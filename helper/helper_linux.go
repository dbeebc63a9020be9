package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/netplane"
)

// Run runs a helper until ctx is done (SIGTERM or SIGINT in the command) or
// the VM's end of the socket goes away, then deletes the TAP. It prints the
// JSON line on o.Stdout once the interface is ready; when it fails before
// that, stdout stays empty and the error says why.
func Run(ctx context.Context, o Options) error {
	if err := o.check(); err != nil {
		return err
	}
	log := &logger{w: o.Stderr, verbose: o.Verbose}
	var uname unix.Utsname
	unix.Uname(&uname)
	log.infof("main", "running %s on Linux %s", os.Args[0], unix.ByteSliceToString(uname.Release[:]))

	// Check the cheap things the VM side gave us before touching the network.
	if o.FD >= 0 {
		if err := checkFD(o.FD); err != nil {
			return err
		}
	}
	bridge, err := networkBridge(o.Network)
	if err != nil && !errors.Is(err, errNeedsMacvtap) {
		return err
	}
	macvtap := errors.Is(err, errNeedsMacvtap)
	if macvtap && o.Attach == AttachTap {
		return fmt.Errorf("%w; --attach tap needs a bridge", err)
	}
	if macvtap && o.Isolation {
		return fmt.Errorf("%w; isolation needs a bridge (bridge mode macvtaps always reach each other)", err)
	}
	id := o.InterfaceID
	if id == "" {
		id = api.NewInterfaceID()
	}
	tapName := o.TapName
	if tapName == "" {
		tapName = api.TapName(id)
	}
	uid, gid, err := owner(o.UID, o.GID)
	if err != nil {
		return err
	}

	// Privileged: create the VM's port, owned by the VM's user, on the network.
	tapFD, mtu := -1, 0
	cleanupTap := func() {
		if tapFD >= 0 {
			unix.Close(tapFD) // a non-persistent TAP goes with its last fd
			tapFD = -1
		}
	}
	defer cleanupTap()
	if macvtap {
		// A macvtap outlives its fds, and the helper is not root when it
		// stops: a root child deletes it when the helper's end of a pipe
		// closes, however the helper ends.
		mv, err := netplane.CreateMacvtap(o.Network, tapName, api.InterfaceMAC(id))
		if err != nil {
			return err
		}
		reaper, err := deleteOnExit(tapName, o.Stderr)
		if err != nil {
			deleteLink(tapName)
			return err
		}
		defer reaper()
		if tapFD, err = openMacvtap(mv, offloadFlags(&o)); err != nil {
			return err
		}
		mtu = mv.Attrs().MTU
		log.infof("main", "created macvtap %s on %s of network %q", tapName, o.Network.Interface, o.Network.ID)
	} else {
		tc := tapConfig{name: tapName, uid: uid, gid: gid, offloads: offloadFlags(&o), persist: o.Attach == AttachTap}
		if tapFD, err = createTap(tc); err != nil {
			return err
		}
		if tc.persist {
			// Like a macvtap, a persistent TAP outlives the helper's fd and
			// its root privileges: a root child deletes it when the helper
			// ends, even while a VMM still holds it, and even on kill -9.
			reaper, err := deleteOnExit(tapName, o.Stderr)
			if err != nil {
				deleteLink(tapName)
				return err
			}
			defer reaper()
		}
		link, err := attachTap(tapName, bridge.Attrs().Name, o.Isolation)
		if err != nil {
			return fmt.Errorf("network %q: %w", o.Network.ID, err)
		}
		log.infof("main", "created TAP %s on bridge %s of network %q", tapName, bridge.Attrs().Name, o.Network.ID)
		mtu = link.Attrs().MTU // AttachPort gave it the bridge's MTU
	}
	if mtu > MaxJumboMTU {
		return fmt.Errorf("network %q has MTU %d; the helper relays frames up to MTU %d", o.Network.ID, mtu, MaxJumboMTU)
	}
	ready := o.ready(id, tapName, mtu)

	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	defer unix.Close(stop)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			signal(stop)
		case <-done:
		}
	}()

	if o.Attach == AttachTap {
		// The VMM opens the TAP itself, as its owner.
		cleanupTap()
		if err := dropPrivileges(uid, gid); err != nil {
			return err
		}
		log.infof("main", "running as uid: %d gid: %d", os.Getuid(), os.Getgid())
		if err := printReady(&o, ready); err != nil {
			return err
		}
		log.infof("main", "TAP %s is ready for the VMM; waiting for termination", tapName)
		tapStats(ctx, &o, log, tapName)
		log.infof("main", "stopping: deleting TAP %s", tapName)
		return nil
	}

	// Unprivileged from here: the VM's socket is only touched as its owner.
	if err := dropPrivileges(uid, gid); err != nil {
		return err
	}
	log.infof("main", "running as uid: %d gid: %d", os.Getuid(), os.Getgid())

	r := &relay{tap: tapFD, stop: stop, host: &counters{}, vm: &counters{}, log: log}
	if o.Offloads() {
		r.hdr = VirtioNetHdrLen
	}
	r.frame = r.hdr + ready.MaxPacketSize

	var lis *listener
	if o.SocketPath != "" {
		lis, err = listen(o.SocketPath, o.Offloads())
		if err != nil {
			return err
		}
		defer lis.close()
		r.sock = lis.fd
	} else {
		r.sock = o.FD
	}
	if err := printReady(&o, ready); err != nil {
		return err
	}

	statsDone := make(chan struct{})
	logStats := func() {
		log.logf("INFO", "stats", "%s", helperproto.FormatStatsLine(helperproto.Stats{Time: time.Now(), Host: r.host.snapshot(), VM: r.vm.snapshot()})[len(helperproto.StatsPrefix):])
	}
	if o.StatsInterval > 0 {
		go func() {
			t := time.NewTicker(o.StatsInterval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					logStats()
				case <-statsDone:
					return
				}
			}
		}()
	}
	defer func() {
		close(statsDone)
		logStats()
	}()

	var first []byte
	if lis != nil {
		log.infof("main", "waiting for client on %q", o.SocketPath)
		buf := make([]byte, r.frame)
		var client string
		first, client, err = lis.accept(stop, buf, log)
		if errors.Is(err, errStopped) {
			log.infof("main", "stopped before a client came")
			return nil
		}
		if err != nil {
			return err
		}
		log.infof("main", "serving client %q", client)
		if len(first) > 0 && len(first) < r.hdr+ethHeaderLen {
			first = nil
		}
	}
	log.infof("main", "forwarding started")
	err = r.run(first)
	switch {
	case errors.Is(err, errPeerGone):
		log.infof("main", "stopping: %v", err)
		return nil
	case err != nil:
		return err
	}
	log.infof("main", "stopping: terminated")
	return nil
}

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
	case AttachTap:
		if o.FD >= 0 || o.SocketPath != "" {
			return errors.New("--attach tap relays nothing: --fd and --socket have no meaning with it")
		}
		if o.Offloads() {
			return errors.New("--enable-tso and --enable-checksum-offload have no meaning with --attach tap: the VMM sets the TAP's offloads when it opens it")
		}
	default:
		return fmt.Errorf("unknown --attach %q (tap, or leave it out to relay over --fd or --socket)", o.Attach)
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
		r.ReadMaxPackets, r.WriteMaxPackets = batchSize, batchSize
	}
	if o.NetworkFlag {
		r.IPv4Subnet = n.Subnet.Masked().Addr()
		r.IPv4Mask = r.SubnetMask
	}
	return r
}

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

// dropPrivileges becomes the VM's owner for good: supplementary groups, gid,
// then uid (Go applies each to every thread of the process).
func dropPrivileges(uid, gid int) error {
	if uid < 0 && gid < 0 {
		return nil
	}
	if gid >= 0 {
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
		if err := syscall.Setgroups(groups); err != nil {
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

// tapStats logs the kernel's counters of a TAP the VMM drives until ctx is
// done. On a TAP the kernel's tx is what it sent to the VM ("host") and its
// rx what the VM sent ("vm").
func tapStats(ctx context.Context, o *Options, log *logger, name string) {
	logStats := func() {
		link, err := netlink.LinkByName(name)
		if err != nil {
			log.warnf("stats", "TAP %s: %v", name, err)
			return
		}
		s := link.Attrs().Statistics
		if s == nil {
			return
		}
		st := helperproto.Stats{
			Time: time.Now(),
			Host: helperproto.Counters{Packets: s.TxPackets, Bytes: s.TxBytes, Drops: s.TxDropped},
			VM:   helperproto.Counters{Packets: s.RxPackets, Bytes: s.RxBytes, Drops: s.RxDropped},
		}
		log.logf("INFO", "stats", "%s", helperproto.FormatStatsLine(st)[len(helperproto.StatsPrefix):])
	}
	var tick <-chan time.Time
	if o.StatsInterval > 0 {
		t := time.NewTicker(o.StatsInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			logStats()
		case <-ctx.Done():
			logStats()
			return
		}
	}
}
