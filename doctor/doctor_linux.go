package doctor

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/netplane"
	"github.com/vmnetctl/vmnetctl/overlay"
)

// installHint is how to install a Debian/Fedora package.
func installHint(deb, rpm string) string {
	return fmt.Sprintf("install it: sudo apt install %s (Debian, Ubuntu) or sudo dnf install %s (Fedora, RHEL)", deb, rpm)
}

// The host paths the checks read, variables so that the tests can put a
// bad condition in their place.
var (
	tunPath          = "/dev/net/tun"
	ipForwardPath    = "/proc/sys/net/ipv4/ip_forward"
	firewalldPidFile = "/var/run/firewalld/firewalld.pid"
	ufwConf          = "/etc/ufw/ufw.conf"
)

func preflight() []check { return []check{checkRoot, checkTun, checkNftInstalled} }

func checks() []check {
	return append([]check{checkRoot, checkTun, checkNft}, checkKernel, checkForwarding, checkIPv6, checkDockerForward, checkFirewalls,
		checkPorts, checkSubnets, checkVXLAN, checkEVPN, checkWireGuard, checkQemu) // checkEVPN: evpn_linux.go
}

func checkRoot(context.Context, []*api.Network) []Finding {
	if os.Geteuid() == 0 {
		return []Finding{{Check: "root", Status: OK, Detail: "running as root"}}
	}
	return []Finding{{Check: "root", Status: Fail, Detail: "not running as root: bridges, TAPs and nftables need it",
		Fix: "run vmnetctl with sudo (the VMs themselves do not need root)"}}
}

func checkTun(context.Context, []*api.Network) []Finding {
	fd, err := unix.Open(tunPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return []Finding{{Check: "/dev/net/tun", Status: OK, Detail: "TUN/TAP devices can be made"}}
	}
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return []Finding{{Check: "/dev/net/tun", Status: Fail, Detail: "cannot open " + tunPath + ": " + err.Error(),
			Fix: "run as root; in a container, pass the device (--device /dev/net/tun) and CAP_NET_ADMIN"}}
	}
	return []Finding{{Check: "/dev/net/tun", Status: Fail, Detail: "cannot open " + tunPath + ": " + err.Error(),
		Fix: "load the tun module: sudo modprobe tun (and add tun to /etc/modules-load.d/ to keep it)"}}
}

// checkNftInstalled is checkNft for Preflight, before every up, down and
// run: that nft is there, without running it (a process more on every
// VM's attach; doctor runs it).
func checkNftInstalled(context.Context, []*api.Network) []Finding {
	path, err := exec.LookPath("nft")
	if err != nil {
		return []Finding{{Check: "nftables", Status: Fail, Detail: "the nft command is not installed",
			Fix: installHint("nftables", "nftables")}}
	}
	return []Finding{{Check: "nftables", Status: OK, Detail: path}}
}

func checkNft(ctx context.Context, nets []*api.Network) []Finding {
	if f := checkNftInstalled(ctx, nets); f[0].Status == Fail {
		return f
	}
	path, _ := exec.LookPath("nft")
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return []Finding{{Check: "nftables", Status: Fail, Detail: path + " --version failed: " + strings.TrimSpace(string(out)),
			Fix: "reinstall nftables"}}
	}
	return []Finding{{Check: "nftables", Status: OK, Detail: strings.TrimSpace(string(out))}}
}

// kernelFeatures are the kernel features vmnetctl uses, each tried for
// real in a network namespace of the check's own (nothing on the host is
// touched): required ones fail when missing, the others warn (the feature
// that needs one fails when used).
var kernelFeatures = []struct {
	name, what string
	// needed says whether these networks need the feature (nil: always);
	// a feature nothing needs is only reported.
	needed func(nets []*api.Network) bool
	probe  func() error
}{
	{"bridge", "Linux bridges (shared and host networks)", nil, func() error {
		return addLink(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "probe-br"}})
	}},
	{"nftables", "nftables NAT, filtering and the bridge family's anti-spoofing", nil, func() error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(`add table inet probe
add chain inet probe nat { type nat hook postrouting priority srcnat; }
add rule inet probe nat masquerade
add table bridge probe
add set bridge probe m { type ether_addr; size 1; flags dynamic; }
add chain bridge probe pre { type filter hook prerouting priority filter; }
add rule bridge probe pre ether saddr != @m add @m { ether saddr }
`)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}},
	{"macvtap", "macvtap ports (bridged networks on a plain interface)", hasBridged, func() error {
		if err := addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe-v0"}, PeerName: "probe-v1"}); err != nil {
			return err
		}
		parent, err := netlink.LinkByName("probe-v0")
		if err != nil {
			return err
		}
		return addLink(&netlink.Macvtap{Macvlan: netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "probe-mvt", ParentIndex: parent.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE}})
	}},
	{"vxlan", "VXLAN (networks across hosts)", hasVXLAN, func() error {
		return addLink(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "probe-vx"}, VxlanId: 42, Port: 4789})
	}},
	// Never needed: without the module, wireguard-go (built in) runs the
	// device; this says which one will.
	{"wireguard", "the kernel's WireGuard device (else wireguard-go, built in, runs it in the controller)", never, func() error {
		return addLink(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: "probe-wg"}})
	}},
	{"vhost-net", "vhost-net (fast TAP attachments for qemu)", never, func() error {
		if !netplane.VhostNet() {
			return errors.New("no /dev/vhost-net")
		}
		return nil
	}},
}

func addLink(l netlink.Link) error { return netlink.LinkAdd(l) }

func hasBridged(nets []*api.Network) bool {
	for _, n := range nets {
		if n.Mode == api.ModeBridged {
			return true
		}
	}
	return false
}

func never([]*api.Network) bool { return false }

func hasVXLAN(nets []*api.Network) bool {
	return slices.ContainsFunc(nets, func(n *api.Network) bool { return n.VXLAN != nil })
}

// checkVXLAN: a network across hosts needs this host in its list (by an
// address of its own) and an underlay interface whose MTU carries the
// network's frames with VXLAN's 50 bytes.
func checkVXLAN(_ context.Context, nets []*api.Network) []Finding {
	var out []Finding
	for _, n := range nets {
		if n.VXLAN == nil {
			continue
		}
		name := "hosts of " + n.ID
		i, dev, err := overlay.VXLANHost(n)
		if err != nil {
			out = append(out, Finding{Check: name, Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("add this host (an address of its own) to networks.%s.vxlan.hosts in networks.yaml, the same on every host", n.ID)})
			continue
		}
		h := n.VXLAN.Hosts[i]
		f := Finding{Check: name, Status: OK, Detail: fmt.Sprintf("this host is %s (%s on %s)", h.Name, h.Address, dev)}
		if l, err := netlink.LinkByName(dev); err == nil && l.Attrs().MTU < n.VXLAN.UnderlayMTU {
			f.Status, f.Detail = Fail, fmt.Sprintf("%s's MTU is %d, less than the underlayMTU %d the network's frames need through the tunnel", dev, l.Attrs().MTU, n.VXLAN.UnderlayMTU)
			f.Fix = fmt.Sprintf("raise %s's MTU to %d (ip link set %s mtu %d, and the switches between the hosts), or lower networks.%s.vxlan.underlayMTU to %d",
				dev, n.VXLAN.UnderlayMTU, dev, n.VXLAN.UnderlayMTU, n.ID, l.Attrs().MTU)
		}
		out = append(out, f)
	}
	return out
}

// errNoProbeNamespace: this user may not make the probe's namespace.
var errNoProbeNamespace = errors.New("not permitted to make a network namespace")

// inProbeNamespace runs f on a thread in a new network namespace that
// goes away with the thread.
func inProbeNamespace(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread, and its namespace, end with this
		// goroutine.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			if errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w: %w", errNoProbeNamespace, err)
			}
			errc <- fmt.Errorf("a network namespace for the check: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func checkKernel(_ context.Context, nets []*api.Network) []Finding {
	var uts unix.Utsname
	unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	var out []Finding
	for _, k := range kernelFeatures {
		name := "kernel: " + k.name
		err := inProbeNamespace(k.probe)
		if errors.Is(err, errNoProbeNamespace) {
			// Not a missing feature: this user may not make the namespace
			// the probe needs (not root).
			out = append(out, Finding{Check: name, Status: Info, Detail: "not checked: needs root (sudo vmnetctl doctor)"})
			continue
		}
		if err != nil {
			st := Fail
			if k.needed != nil {
				st = Info
				if k.needed(nets) {
					st = Warn
				}
			}
			out = append(out, Finding{Check: name, Status: st, Detail: fmt.Sprintf("%s: not available in kernel %s: %v", k.what, release, err),
				Fix: "load its module (modprobe), or install your distribution's kernel modules package (linux-modules-extra on Ubuntu)"})
			continue
		}
		out = append(out, Finding{Check: name, Status: OK, Detail: k.what})
	}
	return out
}

func checkForwarding(_ context.Context, nets []*api.Network) []Finding {
	v, err := os.ReadFile(ipForwardPath)
	on := err == nil && strings.TrimSpace(string(v)) == "1"
	shared := false
	for _, n := range nets {
		shared = shared || n.Mode == api.ModeShared
	}
	switch {
	case on:
		return []Finding{{Check: "IPv4 forwarding", Status: OK, Detail: "on"}}
	case shared:
		return []Finding{{Check: "IPv4 forwarding", Status: Info, Detail: "off; `vmnetctl up` turns it on for shared networks (and leaves it on)"}}
	}
	return []Finding{{Check: "IPv4 forwarding", Status: OK, Detail: "off (no shared network needs it)"}}
}

// checkIPv6 says whether the networks with an IPv6 side get it: not on a
// host that leaves IPv6 off; and, for NAT66, that turning IPv6 forwarding
// on sets accept_ra=2 where it is 1 (so the host keeps the routes it
// learns from router advertisements).
func checkIPv6(_ context.Context, nets []*api.Network) []Finding {
	var v6, nat66 []string
	for _, n := range nets {
		if n.HasIPv6() {
			v6 = append(v6, n.ID)
		}
		if n.RoutesIPv6() {
			nat66 = append(nat66, n.ID)
		}
	}
	if len(v6) == 0 {
		return []Finding{{Check: "IPv6", Status: OK, Detail: "no network has IPv6"}}
	}
	if !hostnet.KernelIPv6() {
		return []Finding{{Check: "IPv6", Status: Warn,
			Detail: "IPv6 is off on this host (ipv6.disable=1 at boot, or net.ipv6.conf.default.disable_ipv6=1): " + strings.Join(v6, ", ") + " will run without it",
			Fix:    "set `ipv6: false` on those networks, or turn IPv6 on (sysctl -w net.ipv6.conf.default.disable_ipv6=0)"}}
	}
	if len(nat66) == 0 || netplane.IPv6Forwarding() {
		return []Finding{{Check: "IPv6", Status: OK, Detail: "on for " + strings.Join(v6, ", ")}}
	}
	ra, _ := netplane.InterfacesAcceptingRA()
	detail := "forwarding off; `vmnetctl up` turns it on for NAT66 (" + strings.Join(nat66, ", ") + ") and leaves it on"
	if len(ra) > 0 {
		detail += "; it first sets accept_ra=2 on " + strings.Join(ra, ", ") + ", so that they keep taking router advertisements with forwarding on"
	}
	return []Finding{{Check: "IPv6", Status: Info, Detail: detail}}
}

// bridgeGlob is vmnetctl's bridges as iptables names them (vmn-+), and as
// nft lists such a match (vmn-*).
const (
	bridgeGlob    = "vmn-+"
	bridgeGlobNft = `"vmn-*"`
)

// forwardRules is what the FORWARD path of iptables holds: whether a
// FORWARD chain's policy is drop, whether Docker's DOCKER-USER chain is
// there, and whether FORWARD or DOCKER-USER accept vmnetctl's bridges both
// ways (the fix checkDockerForward prints). tool is the iptables command
// that showed the rules.
type forwardRules struct {
	drop, docker, acceptIn, acceptOut bool
	tool                              string
}

// readForwardRules reads the ip filter table as nft lists it (iptables-nft
// rules and nft's own), else as iptables-legacy or iptables print it.
func readForwardRules(ctx context.Context) forwardRules {
	var r forwardRules
	if nft, err := exec.LookPath("nft"); err == nil {
		out, _ := exec.CommandContext(ctx, nft, "list", "table", "ip", "filter").CombinedOutput()
		r.parseNft(string(out))
	}
	if r.drop {
		r.tool = "iptables"
		return r
	}
	for _, ipt := range []string{"iptables-legacy", "iptables"} {
		path, err := exec.LookPath(ipt)
		if err != nil {
			continue
		}
		out, _ := exec.CommandContext(ctx, path, "-S").CombinedOutput()
		var l forwardRules
		l.parseSave(string(out))
		if l.drop {
			l.tool = ipt
			return l
		}
	}
	return r
}

// parseNft reads `nft list table ip filter`.
func (r *forwardRules) parseNft(out string) {
	chain := ""
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if name, ok := strings.CutPrefix(l, "chain "); ok {
			chain = strings.TrimSuffix(name, " {")
			r.docker = r.docker || chain == "DOCKER-USER"
			continue
		}
		if chain != "FORWARD" && chain != "DOCKER-USER" {
			continue
		}
		if chain == "FORWARD" && strings.Contains(l, "policy drop;") {
			r.drop = true
		}
		if strings.HasSuffix(l, " accept") || l == "accept" {
			r.acceptIn = r.acceptIn || strings.HasPrefix(l, "iifname "+bridgeGlobNft)
			r.acceptOut = r.acceptOut || strings.HasPrefix(l, "oifname "+bridgeGlobNft)
		}
	}
}

// parseSave reads `iptables -S`.
func (r *forwardRules) parseSave(out string) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "-P" && f[1] == "FORWARD" && f[2] == "DROP":
			r.drop = true
		case len(f) >= 2 && f[0] == "-N" && f[1] == "DOCKER-USER":
			r.docker = true
		case len(f) == 6 && f[0] == "-A" && (f[1] == "FORWARD" || f[1] == "DOCKER-USER") && f[3] == bridgeGlob && f[4] == "-j" && f[5] == "ACCEPT":
			r.acceptIn = r.acceptIn || f[2] == "-i"
			r.acceptOut = r.acceptOut || f[2] == "-o"
		}
	}
}

// checkDockerForward finds the iptables FORWARD policy DROP that Docker
// sets: nftables drops a packet that any base chain drops, so vmnetctl's
// accept does not help; a rule in DOCKER-USER (or, without Docker,
// FORWARD) does, and once it is there the finding is OK.
func checkDockerForward(ctx context.Context, _ []*api.Network) []Finding {
	name := "FORWARD policy"
	r := readForwardRules(ctx)
	if !r.drop {
		return []Finding{{Check: name, Status: OK, Detail: "no iptables FORWARD policy drops routed traffic"}}
	}
	chain := "FORWARD"
	if r.docker {
		chain = "DOCKER-USER"
	}
	if r.acceptIn && r.acceptOut {
		return []Finding{{Check: name, Status: OK, Detail: "the iptables FORWARD policy is DROP, but rules accept vmnetctl's bridges (" + bridgeGlob + ") both ways"}}
	}
	detail := "the iptables FORWARD chain's policy is DROP: shared networks' traffic to the internet is dropped whatever vmnetctl's rules say"
	if r.docker {
		detail += " (Docker sets it)"
	}
	var fix []string
	if !r.acceptOut {
		fix = append(fix, fmt.Sprintf("sudo %s -I %s -o %s -j ACCEPT", r.tool, chain, bridgeGlob))
	}
	if !r.acceptIn {
		fix = append(fix, fmt.Sprintf("sudo %s -I %s -i %s -j ACCEPT", r.tool, chain, bridgeGlob))
	}
	return []Finding{{Check: name, Status: Warn, Detail: detail,
		Fix: "let vmnetctl's bridges through: " + strings.Join(fix, " && ")}}
}

var ufwEnabledRe = regexp.MustCompile(`(?m)^ENABLED=yes`)

// ufwRules are the rules vmnetctl's bridges need in ufw (the fix
// checkFirewalls prints), as `ufw show added` lists them.
var ufwRules = []string{"ufw allow in on " + bridgeGlob, "ufw route allow in on " + bridgeGlob, "ufw route allow out on " + bridgeGlob}

func checkFirewalls(ctx context.Context, nets []*api.Network) []Finding {
	var bridges []string
	for _, n := range nets {
		if n.Routed() {
			bridges = append(bridges, n.Bridge())
		}
	}
	var out []Finding
	if pidAlive(firewalldPidFile) {
		out = append(out, checkFirewalld(ctx, bridges))
	}
	if b, err := os.ReadFile(ufwConf); err == nil && ufwEnabledRe.Match(b) {
		out = append(out, checkUfw(ctx))
	}
	if len(out) == 0 {
		out = append(out, Finding{Check: "firewall", Status: OK, Detail: "neither firewalld nor ufw is active"})
	}
	return out
}

// checkFirewalld: firewalld runs; the bridges must be in its trusted zone
// (firewall-cmd --get-zone-of-interface), or DHCP, DNS and forwarded
// traffic are dropped.
func checkFirewalld(ctx context.Context, bridges []string) Finding {
	name := "firewalld"
	var untrusted []string
	cmd, err := exec.LookPath("firewall-cmd")
	for _, b := range bridges {
		if err == nil {
			zone, _ := exec.CommandContext(ctx, cmd, "--get-zone-of-interface="+b).Output()
			if strings.TrimSpace(string(zone)) == "trusted" {
				continue
			}
		}
		untrusted = append(untrusted, b)
	}
	if len(untrusted) == 0 {
		return Finding{Check: name, Status: OK, Detail: "firewalld runs; vmnetctl's bridges are in its trusted zone"}
	}
	fix := "put vmnetctl's bridges in the trusted zone"
	for _, b := range untrusted {
		fix += fmt.Sprintf("; sudo firewall-cmd --permanent --zone=trusted --add-interface=%s", b)
	}
	detail := "firewalld runs and " + strings.Join(untrusted, ", ") + " are not in its trusted zone: interfaces outside a zone that allows them drop DHCP, DNS and forwarded traffic"
	if err != nil {
		detail = "firewalld runs (without firewall-cmd, vmnetctl cannot tell the bridges' zones): interfaces outside a zone that allows them drop DHCP, DNS and forwarded traffic"
	}
	return Finding{Check: name, Status: Warn, Detail: detail, Fix: fix + "; sudo firewall-cmd --reload"}
}

// checkUfw: ufw is enabled; it needs rules that let the bridges in and
// through (`ufw show added` lists the rules added).
func checkUfw(ctx context.Context) Finding {
	name := "ufw"
	var added []string
	if cmd, err := exec.LookPath("ufw"); err == nil {
		out, _ := exec.CommandContext(ctx, cmd, "show", "added").Output()
		for _, l := range strings.Split(string(out), "\n") {
			added = append(added, strings.Join(strings.Fields(l), " "))
		}
	}
	var missing []string
	for _, r := range ufwRules {
		if !slices.Contains(added, r) {
			missing = append(missing, r)
		}
	}
	if len(missing) == 0 {
		return Finding{Check: name, Status: OK, Detail: "ufw is enabled, with rules that let vmnetctl's bridges (" + bridgeGlob + ") in and through"}
	}
	return Finding{Check: name, Status: Warn,
		Detail: "ufw is enabled: its default routed policy drops forwarded traffic and its input policy DHCP and DNS from VMs",
		Fix:    "sudo " + strings.Join(missing, " && sudo ")}
}

func pidAlive(pidFile string) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && unix.Kill(pid, 0) == nil
}

// listener is a socket bound to a DHCP or DNS port.
type listener struct {
	proto string
	addr  netip.Addr
	port  int
	inode string
}

// listeners reads the UDP and TCP sockets bound to ports from /proc/net.
func listeners(ports ...int) []listener {
	var out []listener
	for _, f := range []struct{ file, proto string }{
		// thread-self: the network namespace of the calling thread.
		{"/proc/thread-self/net/udp", "udp"}, {"/proc/thread-self/net/udp6", "udp"},
		{"/proc/thread-self/net/tcp", "tcp"}, {"/proc/thread-self/net/tcp6", "tcp"},
	} {
		fh, err := os.Open(f.file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			// TCP: only listening sockets (state 0A).
			if f.proto == "tcp" && fields[3] != "0A" {
				continue
			}
			hostHex, portHex, ok := strings.Cut(fields[1], ":")
			port, err := strconv.ParseUint(portHex, 16, 16)
			if !ok || err != nil {
				continue
			}
			for _, p := range ports {
				if int(port) == p {
					out = append(out, listener{proto: f.proto, addr: procAddr(hostHex), port: p, inode: fields[9]})
				}
			}
		}
		fh.Close()
	}
	return out
}

// procAddr decodes an address of /proc/net/{udp,tcp}{,6}: 32-bit words in
// host (little-endian) order.
func procAddr(h string) netip.Addr {
	b, err := hex.DecodeString(h)
	if err != nil || len(b)%4 != 0 {
		return netip.Addr{}
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap()
}

// socketOwner is a process that holds a socket.
type socketOwner struct {
	pid  int
	comm string
}

// socketOwners maps socket inodes to the processes that hold them, in
// /proc's order, from /proc/*/fd.
func socketOwners() map[string][]socketOwner {
	owners := map[string][]socketOwner{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if ino, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
				ino = strings.TrimSuffix(ino, "]")
				if o := owners[ino]; len(o) == 0 || o[len(o)-1].pid != pid {
					owners[ino] = append(o, socketOwner{pid: pid, comm: strings.TrimSpace(string(comm))})
				}
			}
		}
	}
	return owners
}

// ownerName is "name (pid N)" of the last process that holds a socket, ""
// for none.
func ownerName(o []socketOwner) string {
	if len(o) == 0 {
		return ""
	}
	return fmt.Sprintf("%s (pid %d)", o[len(o)-1].comm, o[len(o)-1].pid)
}

// checkPorts finds another program on the DHCP and DNS ports of a gateway:
// one bound to a wildcard address or to the gateway itself keeps
// vmnetctl's DHCP server or DNS proxy from binding.
func checkPorts(_ context.Context, nets []*api.Network) []Finding {
	gateways := map[netip.Addr]string{}
	for _, n := range nets {
		if n.Routed() && n.Gateway.IsValid() && (n.DHCP || n.DNSProxy) {
			gateways[n.Gateway] = n.ID
		}
	}
	if len(gateways) == 0 {
		return nil
	}
	owners := socketOwners()
	var out []Finding
	seen := map[string]bool{}
	for _, l := range listeners(53, 67) {
		who := ownerName(owners[l.inode])
		if strings.HasPrefix(who, "vmnetctl ") || seen[l.inode] {
			continue
		}
		network, onGateway := gateways[l.addr]
		if !l.addr.IsUnspecified() && !onGateway {
			continue // bound to another address: no conflict
		}
		seen[l.inode] = true
		where := fmt.Sprintf("%s %s port %d", l.proto, l.addr, l.port)
		if onGateway {
			where += " (the gateway of network " + network + ")"
		}
		if who == "" {
			who = "another program"
		}
		service := "DNS proxy"
		if l.port == 67 {
			service = "DHCP server"
		}
		out = append(out, Finding{Check: fmt.Sprintf("port %d", l.port), Status: Fail,
			Detail: fmt.Sprintf("%s listens on %s: vmnetctl's %s cannot bind there", who, where, service),
			Fix:    "stop it, or make it bind only its own interfaces (dnsmasq: bind-interfaces and except-interface=vmn-*)"})
	}
	if len(out) == 0 {
		out = append(out, Finding{Check: "ports 53, 67", Status: OK, Detail: "free on every gateway address"})
	}
	return out
}

func checkSubnets(_ context.Context, nets []*api.Network) []Finding {
	var out []Finding
	for _, n := range nets {
		if !n.Routed() || !n.Subnet.IsValid() {
			continue
		}
		name := "subnet of " + n.ID
		if err := netplane.CheckConflicts(n); err != nil {
			out = append(out, Finding{Check: name, Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("give network %s another subnet in networks.yaml", n.ID)})
		} else {
			out = append(out, Finding{Check: name, Status: OK, Detail: n.Subnet.String() + " overlaps nothing on the host"})
		}
	}
	return out
}

var qemuVersionRe = regexp.MustCompile(`version (\d+)\.(\d+)`)

// checkQemu: qemu's -netdev dgram (the socket attachment) needs qemu 7.2.
func checkQemu(context.Context, []*api.Network) []Finding {
	var found []string
	for _, name := range []string{"qemu-system-x86_64", "qemu-system-aarch64", "qemu-kvm"} {
		if p, err := exec.LookPath(name); err == nil {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		return []Finding{{Check: "qemu", Status: Info, Detail: "no qemu found (only needed to run qemu VMs)"}}
	}
	var out []Finding
	for _, p := range found {
		b, _ := exec.Command(p, "--version").Output()
		m := qemuVersionRe.FindSubmatch(b)
		if m == nil {
			out = append(out, Finding{Check: "qemu", Status: Warn, Detail: p + ": version unknown (`" + p + " --version` says no version): -netdev dgram needs qemu 7.2 or later",
				Fix: "check that " + p + " runs; if its version is older than 7.2, upgrade qemu or use `attach: tap` (-netdev tap)"})
			continue
		}
		major, _ := strconv.Atoi(string(m[1]))
		minor, _ := strconv.Atoi(string(m[2]))
		v := fmt.Sprintf("%d.%d", major, minor)
		if major > 7 || major == 7 && minor >= 2 {
			out = append(out, Finding{Check: "qemu", Status: OK, Detail: p + " " + v + ": has -netdev dgram"})
		} else {
			out = append(out, Finding{Check: "qemu", Status: Warn, Detail: p + " " + v + ": -netdev dgram needs qemu 7.2 or later",
				Fix: "upgrade qemu, or use `attach: tap` for this qemu (-netdev tap)"})
		}
	}
	return out
}
