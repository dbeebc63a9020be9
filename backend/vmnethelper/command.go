package vmnethelper

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// This file is the macOS backend's view of vmnet-helper
// (github.com/nirs/vmnet-helper): where it is installed, the command line
// that runs it for one VM attachment, and what of networks.yaml it cannot
// honour. It is platform-independent so that it is tested on Linux; see
// docs/macos.md.

// DefaultPaths are where Find looks when networks.yaml
// sets no paths.vmnetHelper, in order:
//
//   - /opt/homebrew/bin/vmnet-helper: `brew install nirs/vmnet-helper/vmnet-helper`
//     on Apple silicon (the tap installs bin/vmnet-helper; it requires macOS
//     26, where vmnet-helper runs without root);
//   - /usr/local/bin/vmnet-helper: the same on an Intel Mac's Homebrew;
//   - /opt/vmnet-helper/bin/vmnet-helper: vmnet-helper's release archive,
//     extracted as root (the install for macOS 15 and earlier, run via sudo).
var DefaultPaths = []string{
	"/opt/homebrew/bin/vmnet-helper",
	"/usr/local/bin/vmnet-helper",
	"/opt/vmnet-helper/bin/vmnet-helper",
}

// SudoPath is the sudo that runs vmnet-helper as root (macOS 15 and
// earlier). It is an absolute path: the sudoers rule names the helper, and
// a sudo found through PATH could be anything.
const SudoPath = "/usr/bin/sudo"

// Find returns the vmnet-helper to run: configured (networks.yaml's
// paths.vmnetHelper) if set, else the first of DefaultPaths that
// exists. stat is os.Stat outside tests. The file must be a regular,
// executable file that no one but its owner can modify: vmnet-helper runs as
// root through sudo, so its README requires it, and the directory it is in,
// to be owned by root and not writable by other users. Ownership is not
// visible through fs.FileInfo portably; the caller that uses sudo should
// check it (see docs/macos.md).
func Find(configured string, stat func(string) (os.FileInfo, error)) (string, error) {
	if stat == nil {
		stat = os.Stat
	}
	if configured != "" {
		if err := checkExecutable(configured, stat); err != nil {
			return "", fmt.Errorf("paths.vmnetHelper in networks.yaml: %w", err)
		}
		return configured, nil
	}
	var tried []string
	for _, p := range DefaultPaths {
		err := checkExecutable(p, stat)
		if err == nil {
			return p, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			tried = append(tried, p+" (not found)")
			continue
		}
		// It is there but unusable: say so rather than silently run another.
		return "", err
	}
	return "", fmt.Errorf("vmnet-helper is not installed: tried %s; install it (https://github.com/nirs/vmnet-helper#installation) or set paths.vmnetHelper in networks.yaml",
		strings.Join(tried, ", "))
}

func checkExecutable(path string, stat func(string) (os.FileInfo, error)) error {
	fi, err := stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s does not exist: %w", path, fs.ErrNotExist)
		}
		return err
	}
	switch m := fi.Mode(); {
	case !m.IsRegular():
		return fmt.Errorf("%s is not a regular file (%s)", path, m)
	case m.Perm()&0o111 == 0:
		return fmt.Errorf("%s is not executable (%s)", path, m.Perm())
	case m.Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by group or others (%s): vmnet-helper runs as root and must be modifiable only by root (chmod go-w)", path, m.Perm())
	}
	return nil
}

// CheckOwner checks what vmnet-helper's README requires before
// it is run as root through sudo: path and every directory above it are
// owned by root and writable by no one else (a sticky directory such as
// /tmp does not count as safe either). path should have its symlinks
// resolved (filepath.EvalSymlinks): Homebrew's bin/vmnet-helper is a link
// into a Cellar the user owns, which is fine on macOS 26 (no sudo) and
// refused here. stat is os.Stat outside tests; uid returns a FileInfo's
// owner (on darwin, fi.Sys().(*syscall.Stat_t).Uid), false if unknown.
func CheckOwner(path string, stat func(string) (os.FileInfo, error), uid func(os.FileInfo) (uint32, bool)) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("vmnet-helper path %q is not absolute", path)
	}
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		fi, err := stat(p)
		if err != nil {
			return err
		}
		owner, ok := uid(fi)
		switch {
		case !ok:
			return fmt.Errorf("cannot tell the owner of %s", p)
		case owner != 0:
			return fmt.Errorf("%s is owned by uid %d, not root: vmnet-helper runs as root through sudo, so it and its directories must be root's (vmnet-helper's README)", p, owner)
		case fi.Mode().Perm()&0o022 != 0:
			return fmt.Errorf("%s is writable by group or others (%s): vmnet-helper runs as root through sudo, so only root may modify it and its directories", p, fi.Mode().Perm())
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// Options are the settings of one vmnet-helper process (one VM
// attachment).
type Options struct {
	// Path is the vmnet-helper executable (Find).
	Path string
	// Socket is the unix datagram socket vmnet-helper creates (--socket),
	// or "" with FD.
	Socket string
	// FD is the helper's end of a socketpair, as numbered in the helper's
	// process (--fd), or -1 when unused. It must be 3 or more.
	FD int
	// InterfaceID is the vmnet interface id (--interface-id), a UUID; the
	// same id gives the same MAC address. Empty lets vmnet-helper pick a
	// random one. See VMNetHelperInterfaceID.
	InterfaceID string
	// Network is the networks.yaml network to create a vmnet interface for
	// (--operation-mode and friends). Exactly one of Network and
	// BrokerNetwork is set.
	Network *api.Network
	// BrokerNetwork joins a network of vmnet-broker instead (--network NAME,
	// macOS 26); the broker defines its mode and addresses, and vmnet its
	// interface: InterfaceID is not passed (vmnet-helper ignores it there),
	// so the MAC in the JSON line changes from run to run.
	BrokerNetwork string
	// Isolation isolates the interface (--enable-isolation) on a
	// BrokerNetwork; with Network, Network.Isolation does (either turns it on).
	Isolation bool
	// TSO and ChecksumOffload enable vmnet's offloads (--enable-tso,
	// --enable-checksum-offload): datagrams then carry a virtio-net header.
	TSO, ChecksumOffload bool
	// StatsInterval makes the helper log a stats line this often
	// (--stats-interval, whole seconds, rounded up); 0 leaves it out.
	StatsInterval time.Duration
	// Verbose logs DEBUG lines (-v).
	Verbose bool
	// Sudo runs the helper as root through `sudo --non-interactive`
	// (macOS 15 and earlier; macOS 26 needs no root).
	Sudo bool
}

// Command returns the full argv that runs vmnet-helper with o:
// the helper itself, or with o.Sudo
//
//	/usr/bin/sudo --non-interactive --close-from N PATH FLAGS...
//
// where N is o.FD+1 (so sudo keeps the passed socket open; this needs
// closefrom_override in the sudoers rule, which vmnet-helper's installs) or
// 3 without an fd (sudo's default closefrom, which sudoers accepts without
// closefrom_override, so --socket works on Macs whose sudoers cannot change). Flags come in a fixed order: --fd or --socket,
// --interface-id (not with --network), the network (--network NAME, or
// --operation-mode with --shared-interface for bridged or the three address
// flags for shared and host), the offloads, --enable-isolation,
// --stats-interval, -v.
//
// The addresses are the network's: vmnet's --start-address is the gateway
// (the DHCP pool starts right after it), --end-address the end of the DHCP
// range, --subnet-mask the subnet's. A network without a subnet (api gives
// every shared and host network one, so only a hand-made api.Network) passes
// none and gets vmnet's default. Errors are what vmnet-helper or
// vmnet would refuse (CheckNetwork); settings it would silently
// not honour are NetworkWarnings.
func Command(o Options) ([]string, error) {
	if o.Path == "" {
		return nil, errors.New("vmnet-helper: no path (see Find)")
	}
	var args []string
	switch {
	case o.Socket != "" && o.FD >= 0:
		return nil, errors.New("vmnet-helper: give a socket or an fd, not both")
	case o.Socket != "":
		// vmnet-helper refuses paths longer than sun_path (104 bytes on
		// macOS, with the NUL).
		if len(o.Socket) > 103 {
			return nil, fmt.Errorf("vmnet-helper: socket path %s is %d bytes, more than macOS's limit of 103", o.Socket, len(o.Socket))
		}
		args = append(args, "--socket", o.Socket)
	case o.FD >= 3:
		args = append(args, "--fd", strconv.Itoa(o.FD))
	case o.FD >= 0:
		return nil, fmt.Errorf("vmnet-helper: fd %d is stdin, stdout or stderr; pass the socket as fd 3 or above", o.FD)
	default:
		return nil, errors.New("vmnet-helper: needs a socket path or an fd (FD is -1 when unused)")
	}
	if o.InterfaceID != "" {
		if !api.ValidInterfaceID(o.InterfaceID) {
			return nil, fmt.Errorf("vmnet-helper: interface id %q is not a UUID", o.InterfaceID)
		}
		// With --network vmnet-helper ignores --interface-id and warns
		// ("--interface-id is ignored with --network", programs/helper.c):
		// vmnet picks the interface and its MAC. Leave it out there.
		if o.BrokerNetwork == "" {
			args = append(args, "--interface-id", o.InterfaceID)
		}
	}
	switch {
	case o.BrokerNetwork != "" && o.Network != nil:
		return nil, fmt.Errorf("vmnet-helper: give a network or a vmnet-broker network (%q), not both: --network excludes the mode and address flags", o.BrokerNetwork)
	case o.BrokerNetwork != "":
		if strings.HasPrefix(o.BrokerNetwork, "-") {
			return nil, fmt.Errorf("vmnet-helper: vmnet-broker network name %q starts with '-'", o.BrokerNetwork)
		}
		args = append(args, "--network", o.BrokerNetwork)
	case o.Network != nil:
		if err := CheckNetwork(o.Network); err != nil {
			return nil, err
		}
		n := o.Network
		args = append(args, "--operation-mode", string(n.Mode))
		if n.Mode == api.ModeBridged {
			args = append(args, "--shared-interface", n.Interface)
		} else if n.Subnet.IsValid() {
			args = append(args,
				"--start-address", n.Gateway.String(),
				"--end-address", n.DHCPEnd.String(),
				"--subnet-mask", api.SubnetMask(n.Subnet).String())
		}
	default:
		return nil, errors.New("vmnet-helper: no network to join")
	}
	if o.TSO {
		args = append(args, "--enable-tso")
	}
	if o.ChecksumOffload {
		args = append(args, "--enable-checksum-offload")
	}
	// vmnet-helper takes --enable-isolation with shared, host and --network
	// (CheckNetwork refuses it with bridged, as vmnet-helper does).
	if o.Isolation || (o.Network != nil && o.Network.Isolation) {
		args = append(args, "--enable-isolation")
	}
	if o.StatsInterval < 0 {
		return nil, fmt.Errorf("vmnet-helper: negative stats interval %v", o.StatsInterval)
	}
	if o.StatsInterval > 0 {
		secs := int64(math.Ceil(o.StatsInterval.Seconds()))
		args = append(args, "--stats-interval", strconv.FormatInt(secs, 10))
	}
	if o.Verbose {
		args = append(args, "-v")
	}
	argv := []string{o.Path}
	if o.Sudo {
		closeFrom := 3
		if o.FD >= 0 {
			closeFrom = o.FD + 1
		}
		argv = []string{SudoPath, "--non-interactive", "--close-from", strconv.Itoa(closeFrom), o.Path}
	}
	return append(argv, args...), nil
}

// CheckNetwork reports why vmnet-helper cannot run a network at
// all: a mode vmnetctl does not manage, a bridged network without an
// interface, isolation on a bridged network (vmnet-helper's
// programs/options.c refuses --enable-isolation with --operation-mode
// bridged, and passes it to vmnet with shared and host), or addresses vmnet
// refuses (not IPv4, not private, DHCP range outside the subnet). validate
// and plan should report it as an error on macOS.
func CheckNetwork(n *api.Network) error {
	switch n.Mode {
	case api.ModeShared, api.ModeHost:
	case api.ModeBridged:
		if n.Interface == "" {
			return fmt.Errorf("network %q: a bridged network needs an interface (vmnet-helper --shared-interface)", n.ID)
		}
		if strings.HasPrefix(n.Interface, "-") {
			return fmt.Errorf("network %q: interface %q starts with '-'", n.ID, n.Interface)
		}
	default:
		return fmt.Errorf("network %q: mode %q is not one vmnet-helper runs (shared, host or bridged)", n.ID, n.Mode)
	}
	if n.Isolation && n.Mode == api.ModeBridged {
		// programs/options.c: "Conflicting arguments: enable-isolation
		// cannot be used with bridged mode"; shared and host take it.
		return fmt.Errorf("network %q: isolation cannot be used on a bridged network on macOS: vmnet-helper refuses --enable-isolation with --operation-mode bridged (it takes it with shared and host)", n.ID)
	}
	if n.Mode == api.ModeBridged || !n.Subnet.IsValid() {
		return nil
	}
	if !n.Subnet.Addr().Is4() || !n.Gateway.Is4() || !n.DHCPEnd.Is4() {
		return fmt.Errorf("network %q: vmnet needs an IPv4 subnet, gateway and DHCP end (have %s, %s, %s)", n.ID, n.Subnet, n.Gateway, n.DHCPEnd)
	}
	if !n.Subnet.Addr().IsPrivate() {
		return fmt.Errorf("network %q: vmnet accepts only private (RFC 1918) addresses, and %s is not", n.ID, n.Subnet)
	}
	if !n.Subnet.Contains(n.Gateway) || !n.Subnet.Contains(n.DHCPEnd) || !n.Gateway.Less(n.DHCPEnd) {
		return fmt.Errorf("network %q: vmnet needs the gateway %s before the DHCP end %s, both in %s", n.ID, n.Gateway, n.DHCPEnd, n.Subnet)
	}
	return nil
}

// MTU is the only MTU vmnet-helper gives a network: it has no MTU
// option, and vmnet's default is 1500.
const MTU = 1500

// NetworkWarnings lists the settings of n that vmnet-helper cannot honour
// on macOS, one sentence each starting with the networks.yaml key, so that
// validate and plan show them instead of silently dropping them. vmnet runs
// its own DHCP server (bootpd), DNS proxy and NAT for shared and host
// networks, and vmnetctl only launches vmnet-helper; the LAN serves a
// bridged network. Errors (what cannot run at all) are
// CheckNetwork's.
func NetworkWarnings(n *api.Network) []string {
	var w []string
	add := func(format string, args ...any) { w = append(w, fmt.Sprintf(format, args...)) }
	if !n.Managed() {
		return nil
	}
	if n.MTU != MTU {
		add("mtu: %d cannot be honoured on macOS: vmnet-helper has no MTU option, so the network's MTU is vmnet's %d", n.MTU, MTU)
	}
	if !n.Routed() {
		return w // bridged: the LAN provides DHCP, DNS and routing
	}
	if !n.DHCP {
		add("dhcp: false cannot be honoured on macOS: vmnet always runs its DHCP server on %s networks", n.Mode)
	}
	if n.Gateway.IsValid() && n.DHCPStart.IsValid() && n.DHCPStart != n.Gateway.Next() {
		add("dhcpRange: the start %s cannot be honoured on macOS: vmnet's DHCP pool starts right after the gateway, so it is %s-%s", n.DHCPStart, n.Gateway.Next(), n.DHCPEnd)
	}
	if len(n.Reservations) > 0 {
		add("reservations: %d reservation%s cannot be honoured on macOS: vmnet's DHCP server takes no reservations from vmnetctl, so those VMs get an address from the pool", len(n.Reservations), plural(len(n.Reservations)))
	}
	if n.LeaseTime != api.DefaultLeaseTime && n.LeaseTime != 0 {
		add("leaseTime: %s cannot be honoured on macOS: vmnet's DHCP server uses its own lease time", n.LeaseTime)
	}
	if !n.DNSProxy {
		add("dnsProxy: false cannot be honoured on macOS: vmnet always offers its DNS proxy on the gateway %s", gatewayOrDefault(n))
	} else {
		add("dnsProxy: the names of VMs (NAME.vmnet.internal) are not served on macOS: vmnet's DNS proxy forwards to the host's resolvers only")
	}
	if n.Mode == api.ModeShared {
		if !n.NAT44 {
			add("nat44: false cannot be honoured on macOS: a vmnet shared network always NATs IPv4 to the outside (use mode: host for a network without a way out)")
		}
		if !n.HasIPv6() {
			add("ipv6: false cannot be honoured on macOS: a vmnet shared network always has an IPv6 NAT66 prefix")
		} else {
			if !n.NAT66 {
				add("nat66: false cannot be honoured on macOS: a vmnet shared network always has an IPv6 NAT66 prefix")
			}
			if !n.RouterAdvertisement {
				add("routerAdvertisement: false cannot be honoured on macOS: vmnet advertises its NAT66 prefix on shared networks")
			}
		}
	}
	if n.Egress != nil {
		add("egress cannot be honoured on macOS: vmnet has no egress filtering")
	}
	if n.HasIPv6() && n.Subnet6 != api.ULAPrefix(n.ID) {
		add("subnet6: %s cannot be honoured on macOS: vmnet chooses the IPv6 prefix itself (vmnet-helper reports it as vmnet_nat66_prefix)", n.Subnet6)
	}
	return w
}

func gatewayOrDefault(n *api.Network) string {
	if n.Gateway.IsValid() {
		return n.Gateway.String()
	}
	return "(vmnet's default)"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
