package overlay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/atomicfile"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/nettypes"
)

// A segment with EVPN (api.EVPN): the tunnel's device does not learn
// (nolearning, and its bridge port neither), vmnetctl writes no flooding
// entry, and FRR's zebra installs what BGP EVPN tells it: a type-3 route
// per host that has the VNI becomes an all-zeros flooding entry to it, a
// type-2 route a MAC (extern_learn) behind the host that has it.
//
// vmnetctl gives FRR the BGP sessions to the segment's other hosts: its
// own peer-group (evpnPeerGroup, one per state dir) in `router bgp ASN`,
// each other host a member, the group active in `address-family l2vpn
// evpn` with advertise-all-vni. What it wrote for a network is kept in
// the state dir (FRRConfigFile), applied with `vtysh -f`, and never saved
// to FRR's own configuration (no `write memory`): FRR restarted has lost
// it, and the controller gives it back (EnsureFRR, on Check's
// nettypes.FRRError). What vmnetctl added to the router (the router
// itself, or advertise-all-vni) is marked in the groups' descriptions, in
// FRR, shared by every state dir (markRouter). Remove takes out the
// members no other network of the state dir still needs, then the group,
// and with the last vmnetctl group, what the marks say vmnetctl added:
// a user's own FRR configuration is left as it was.

// evpnPeerGroup is the BGP peer-group of this state dir's EVPN sessions:
// "vmnetctl", and the owner's tag when there is one.
func evpnPeerGroup() string {
	if o := hostnet.Owner(); o != "" {
		return "vmnetctl-" + o
	}
	return "vmnetctl"
}

// evpnDescription is the description of evpnPeerGroup: whose it is.
func evpnDescription() string {
	if o := hostnet.Owner(); o != "" {
		return hostnet.AliasPrefix + "evpn@" + o
	}
	return hostnet.AliasPrefix + "evpn"
}

// frrPathspace is the FRR instance vmnetctl talks to: FRR's convention
// (frrinit.sh start NS, the daemons' -N NS) is one instance per network
// namespace, named as the namespace, with its sockets under
// /var/run/frr/NS; a vmnetctl running in a named namespace (as `ip netns
// identify` names it) uses that one, else the host's ("").
func frrPathspace() string {
	self, ok := hostnet.ThreadNetNS()
	if !ok {
		return ""
	}
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return ""
	}
	for _, e := range entries {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/run/netns", e.Name()), &st) == nil && st.Dev == self.Dev && st.Ino == self.Ino {
			return e.Name()
		}
	}
	return ""
}

// errNoFRR: FRR's vtysh is not installed, no daemon of the instance
// answers it, or bgpd is not running: FRR has nothing of vmnetctl's.
var errNoFRR = errors.New("FRR is not running")

// errFRRHung: vtysh got no answer in time. FRR may hold vmnetctl's
// configuration still.
var errFRRHung = errors.New("FRR does not answer")

// frrUnreachable says whether err is FRR not running or not answering:
// the network runs without its FRR part, retried on its own.
func frrUnreachable(err error) bool {
	return errors.Is(err, errNoFRR) || errors.Is(err, errFRRHung)
}

// vtysh runs FRR's vtysh on this host's (or namespace's) instance with
// args and returns its output.
func vtysh(ctx context.Context, args ...string) (string, error) {
	return vtyshIn(ctx, frrPathspace(), args...)
}

// vtyshIn is vtysh on FRR instance ns (frrPathspace).
func vtyshIn(ctx context.Context, ns string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if ns != "" {
		args = append([]string{"-N", ns}, args...)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "vtysh", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var msgs []string
	for _, l := range strings.Split(stderr.String()+stdout.String(), "\n") {
		// vtysh reads its own vtysh.conf, which a pathspace often lacks.
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "vtysh.conf") {
			msgs = append(msgs, l)
		}
	}
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return "", fmt.Errorf("%w: vtysh is not installed (install FRR: apt-get install frr, with zebra and bgpd on)", errNoFRR)
	case ctx.Err() != nil:
		return "", fmt.Errorf("%w%s: vtysh %s got no answer in time (is a daemon stopped or hung?)", errFRRHung, pathspaceNote(ns), strings.Join(args, " "))
	case err != nil && strings.Contains(stderr.String()+stdout.String(), "failed to connect"):
		return "", fmt.Errorf("%w%s: vtysh reaches no daemon (start zebra and bgpd)", errNoFRR, pathspaceNote(ns))
	case err != nil:
		if len(msgs) > 5 {
			msgs = msgs[:5]
		}
		return stdout.String(), fmt.Errorf("vtysh%s %s: %v: %s", pathspaceNote(ns), strings.Join(args, " "), err, strings.Join(msgs, "; "))
	}
	return stdout.String(), nil
}

func pathspaceNote(ns string) string {
	if ns != "" {
		return " (FRR instance " + ns + ", of this network namespace)"
	}
	return ""
}

// bgpRouter is what FRR's running configuration holds of one `router bgp
// ASN` of the default VRF.
type bgpRouter struct {
	routerID string
	// neighbors maps each neighbor address to its peer-group ("" none).
	neighbors map[string]string
	groups    map[string]bool
	// descriptions are the neighbors' and groups' descriptions.
	descriptions map[string]string
	// evpnActive are the neighbors and groups active in l2vpn evpn.
	evpnActive      map[string]bool
	advertiseAllVNI bool
	// lines is every line of the router's block, with its address family
	// ("" outside one), but the address-family lines and "!".
	lines []bgpLine
}

// bgpLine is one line of a router's block.
type bgpLine struct {
	af     string
	fields []string
}

// parseBGP reads the default VRF's BGP routers from `show running-config`.
func parseBGP(conf string) map[uint32]*bgpRouter {
	routers := map[uint32]*bgpRouter{}
	var r *bgpRouter
	af := ""
	sc := bufio.NewScanner(strings.NewReader(conf))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if !strings.HasPrefix(line, " ") {
			r = nil
			if len(f) == 3 && f[0] == "router" && f[1] == "bgp" {
				if asn, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					r = &bgpRouter{neighbors: map[string]string{}, groups: map[string]bool{}, descriptions: map[string]string{}, evpnActive: map[string]bool{}}
					routers[uint32(asn)] = r
					af = ""
				}
			}
			continue
		}
		if r == nil || len(f) == 0 || f[0] == "!" {
			continue
		}
		switch {
		case f[0] == "address-family":
			af = strings.Join(f[1:], " ")
			continue
		case f[0] == "exit-address-family":
			af = ""
			continue
		case af == "" && len(f) == 3 && f[0] == "bgp" && f[1] == "router-id":
			r.routerID = f[2]
		case af == "" && len(f) == 3 && f[0] == "neighbor" && f[2] == "peer-group":
			r.groups[f[1]] = true
		case af == "" && len(f) == 4 && f[0] == "neighbor" && f[2] == "peer-group":
			r.neighbors[f[1]] = f[3]
		case af == "" && len(f) >= 3 && f[0] == "neighbor" && f[2] == "remote-as":
			if _, ok := r.neighbors[f[1]]; !ok && !r.groups[f[1]] {
				r.neighbors[f[1]] = ""
			}
		case af == "" && len(f) >= 4 && f[0] == "neighbor" && f[2] == "description":
			r.descriptions[f[1]] = strings.Join(f[3:], " ")
		case af == "l2vpn evpn" && len(f) == 3 && f[0] == "neighbor" && f[2] == "activate":
			r.evpnActive[f[1]] = true
		case af == "l2vpn evpn" && len(f) == 1 && f[0] == "advertise-all-vni":
			r.advertiseAllVNI = true
		}
		r.lines = append(r.lines, bgpLine{af, f})
	}
	return routers
}

// What vmnetctl added to FRR, shared by every state dir (owner) whose
// segments are in the router: the marks are words of the description of
// each vmnetctl peer-group (evpnDescription), in FRR itself, so that they
// live exactly as long as what they mark (FRR restarted has lost both) and
// any owner reads them. Whoever joins a router another owner's group is
// in copies that group's marks; the last vmnetctl group to leave removes
// what they say vmnetctl added, and nothing else.
const (
	// markRouter: vmnetctl made `router bgp ASN` (and its router id); it
	// goes with the last vmnetctl group if it holds only vmnetctl's lines.
	markRouter = "router-made"
	// markAdvertise: vmnetctl added advertise-all-vni to a router of the
	// user's.
	markAdvertise = "advertise-all-vni-added"
)

// evpnMarks is what vmnetctl added to a router.
type evpnMarks struct{ router, advertise bool }

// vmnetctlGroup says whether peer-group g of r is vmnetctl's (any owner's):
// its description says so.
func (r *bgpRouter) vmnetctlGroup(g string) bool {
	d := strings.Fields(r.descriptions[g])
	return r.groups[g] && len(d) > 0 && (d[0] == hostnet.AliasPrefix+"evpn" || strings.HasPrefix(d[0], hostnet.AliasPrefix+"evpn@"))
}

// vmnetctlGroups are r's peer-groups that are vmnetctl's, sorted.
func (r *bgpRouter) vmnetctlGroups() []string {
	var out []string
	for g := range r.groups {
		if r.vmnetctlGroup(g) {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// marks are what the descriptions of r's vmnetctl groups say vmnetctl
// added to r (of groups, when given, only those).
func (r *bgpRouter) marks(groups ...string) evpnMarks {
	var m evpnMarks
	for _, g := range r.vmnetctlGroups() {
		if len(groups) > 0 && !slices.Contains(groups, g) {
			continue
		}
		for _, w := range strings.Fields(r.descriptions[g])[1:] {
			m.router = m.router || w == markRouter
			m.advertise = m.advertise || w == markAdvertise
		}
	}
	return m
}

// onlyVmnetctl says whether r holds nothing but lines vmnetctl writes
// (evpnConfig's, of any owner) and lines about vmnetctl's groups and their
// members (which go with them): removing it loses nothing of the user's.
func (r *bgpRouter) onlyVmnetctl() bool {
	ours := func(nb string) bool { return r.vmnetctlGroup(nb) || r.vmnetctlGroup(r.neighbors[nb]) }
	for _, l := range r.lines {
		f := l.fields
		switch {
		case len(f) >= 2 && f[0] == "neighbor" && ours(f[1]):
		case len(f) >= 3 && f[0] == "no" && f[1] == "neighbor" && ours(f[2]):
		case l.af == "" && len(f) == 3 && f[0] == "bgp" && f[1] == "router-id":
		case l.af == "l2vpn evpn" && len(f) == 1 && f[0] == "advertise-all-vni":
		default:
			return false
		}
	}
	return true
}

// evpnPeers are the underlay addresses of the other hosts of n's segment.
func evpnPeers(n *api.Network, self int) []netip.Addr {
	var peers []netip.Addr
	for i, h := range n.VXLAN.Hosts {
		if i != self {
			peers = append(peers, h.Address)
		}
	}
	return peers
}

// evpnConfig is the FRR configuration of n's segment on the host with
// underlay address local: its header marks it as vmnetctl's and n's; its
// peer-group's description carries marks, what vmnetctl added to the
// router; vmnetctl sets the router id of a router it made.
func evpnConfig(n *api.Network, local netip.Addr, peers []netip.Addr, marks evpnMarks) string {
	pg := evpnPeerGroup()
	desc := evpnDescription()
	if marks.router {
		desc += " " + markRouter
	}
	if marks.advertise {
		desc += " " + markAdvertise
	}
	var b strings.Builder
	fmt.Fprintf(&b, "! %s: FRR configuration of network %s's VXLAN segment (VNI %d), written by vmnetctl,\n", hostnet.Mark(n.ID), n.ID, n.VXLAN.VNI)
	fmt.Fprintf(&b, "! applied with vtysh and removed by vmnetctl down; edit networks.yaml, not this file.\n")
	fmt.Fprintf(&b, "router bgp %d\n", n.VXLAN.EVPN.ASN)
	// The group and its marks first: vtysh -f cut short leaves no router
	// that is vmnetctl's without saying so.
	fmt.Fprintf(&b, " neighbor %s peer-group\n neighbor %s description %s\n neighbor %s remote-as internal\n", pg, pg, desc, pg)
	if marks.router {
		fmt.Fprintf(&b, " bgp router-id %s\n", local)
	}
	for _, p := range peers {
		fmt.Fprintf(&b, " neighbor %s peer-group %s\n", p, pg)
	}
	fmt.Fprintf(&b, " address-family ipv4 unicast\n  no neighbor %s activate\n exit-address-family\n", pg)
	fmt.Fprintf(&b, " address-family l2vpn evpn\n  neighbor %s activate\n  advertise-all-vni\n exit-address-family\nexit\n", pg)
	return b.String()
}

// evpnConflict tells what in FRR's routers keeps n's segment from being
// configured: BGP running with another AS, a router id that is not this
// host's underlay address, a neighbor of the segment that the user (or
// another state dir) configured outside this state dir's peer-group, or
// another neighbor active for l2vpn evpn, to which advertise-all-vni would
// leak the segment's VNI.
func evpnConflict(routers map[uint32]*bgpRouter, n *api.Network, local netip.Addr, peers []netip.Addr) error {
	asn := n.VXLAN.EVPN.ASN
	for other := range routers {
		if other != asn {
			return fmt.Errorf("network %q: FRR runs BGP as AS %d, and networks.yaml's vxlan.evpn.asn is %d: one router per host; set vxlan.evpn.asn to %d, or remove router bgp %d", n.ID, other, asn, other, other)
		}
	}
	r := routers[asn]
	if r == nil {
		return nil
	}
	if r.routerID != "" && r.routerID != local.String() {
		return fmt.Errorf("network %q: FRR's router bgp %d has the router id %s, not this host's underlay address %s: set bgp router-id %s, or remove it", n.ID, asn, r.routerID, local, local)
	}
	pg := evpnPeerGroup()
	for _, p := range peers {
		g, ok := r.neighbors[p.String()]
		switch {
		case !ok || g == pg:
		case r.vmnetctlGroup(g):
			return fmt.Errorf("network %q: FRR's router bgp %d already peers with %s for another vmnetctl state dir (peer-group %s, %s): a host peers with another once; run the networks the two hosts share from one state dir", n.ID, asn, p, g, strings.Fields(r.descriptions[g])[0])
		default:
			return fmt.Errorf("network %q: FRR's router bgp %d already has the neighbor %s, configured outside vmnetctl (peer-group %q): remove it (no neighbor %s) so that vmnetctl can peer with that host", n.ID, asn, p, g, p)
		}
	}
	var leaks []string
	for nb := range r.evpnActive {
		if !r.vmnetctlGroup(nb) && !r.vmnetctlGroup(r.neighbors[nb]) {
			leaks = append(leaks, nb)
		}
	}
	if len(leaks) > 0 {
		slices.Sort(leaks)
		return fmt.Errorf("network %q: FRR's router bgp %d has %s active for l2vpn evpn, outside vmnetctl: advertise-all-vni would announce the segment's VNI %d to it; deactivate it (address-family l2vpn evpn, no neighbor %s activate), or keep EVPN segments off this host", n.ID, asn, leaks[0], n.VXLAN.VNI, leaks[0])
	}
	return nil
}

// evpnDrift is what FRR's running configuration lacks of n's segment, and
// the members of this state dir's peer-group that none of its networks
// has (members: every peer of the state dir's FRR files; nil, no check).
func evpnDrift(routers map[uint32]*bgpRouter, n *api.Network, peers []netip.Addr, members map[string]bool) []string {
	asn, pg := n.VXLAN.EVPN.ASN, evpnPeerGroup()
	r := routers[asn]
	if r == nil {
		return []string{fmt.Sprintf("has no router bgp %d", asn)}
	}
	var out []string
	if !r.groups[pg] {
		out = append(out, "has no peer-group "+pg)
	}
	for _, p := range peers {
		if r.neighbors[p.String()] != pg {
			out = append(out, fmt.Sprintf("has no neighbor %s in %s", p, pg))
		}
	}
	for _, nb := range strangers(r, members) {
		out = append(out, fmt.Sprintf("has the neighbor %s in %s, which no network of this state dir has", nb, pg))
	}
	if !r.evpnActive[pg] {
		out = append(out, pg+" is not active for l2vpn evpn")
	}
	if !r.advertiseAllVNI {
		out = append(out, "does not advertise-all-vni")
	}
	return out
}

// strangers are the members of this state dir's peer-group in r that are
// not in members (nil: no check), sorted.
func strangers(r *bgpRouter, members map[string]bool) []string {
	if members == nil {
		return nil
	}
	var out []string
	for nb, g := range r.neighbors {
		if g == evpnPeerGroup() && !members[nb] {
			out = append(out, nb)
		}
	}
	slices.Sort(out)
	return out
}

// dirPeers are the peers of every FRR file in frr dir dir but skip, and
// how many files there are.
func dirPeers(dir, skip string) (peers map[string]bool, files int) {
	peers = map[string]bool{}
	all, _ := filepath.Glob(filepath.Join(dir, "*.conf"))
	for _, f := range all {
		if f == skip {
			continue
		}
		files++
		b, _ := os.ReadFile(f)
		_, ps := fileBGP(string(b))
		for _, p := range ps {
			peers[p] = true
		}
	}
	return peers, files
}

// bgpdRunning says whether FRR's bgpd answers: with zebra alone, vtysh
// shows a configuration without BGP and takes BGP's commands without a
// word (and applies none).
func bgpdRunning(ctx context.Context) error {
	return bgpdRunningIn(ctx, frrPathspace())
}

func bgpdRunningIn(ctx context.Context, ns string) error {
	out, err := vtyshIn(ctx, ns, "-c", "show daemons")
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(out), "bgpd") {
		return fmt.Errorf("%w%s: bgpd is not running (FRR runs %s): turn bgpd on in /etc/frr/daemons (bgpd=yes) and restart FRR", errNoFRR, pathspaceNote(ns), strings.Join(strings.Fields(out), ", "))
	}
	return nil
}

// runningBGP is FRR's BGP routers, once bgpd answers.
func runningBGP(ctx context.Context) (map[uint32]*bgpRouter, error) {
	if err := bgpdRunning(ctx); err != nil {
		return nil, err
	}
	running, err := vtysh(ctx, "-c", "show running-config")
	if err != nil {
		return nil, err
	}
	return parseBGP(running), nil
}

// ensureEVPN gives FRR n's segment (and takes vx's bridge port's learning
// off: FRR's entries are the only ones).
func ensureEVPN(ctx context.Context, n *api.Network, vx netlink.Link, self int, local netip.Addr) error {
	if p, err := netlink.LinkGetProtinfo(vx); err != nil || p.Learning {
		if err := netlink.LinkSetLearning(vx, false); err != nil {
			return fmt.Errorf("network %q: turning learning off on %s's bridge port: %w", n.ID, vx.Attrs().Name, err)
		}
	}
	stateDir := hostnet.OwnerDir()
	if stateDir == "" {
		return fmt.Errorf("network %q: EVPN needs a state dir to keep its FRR configuration in", n.ID)
	}
	if err := ensureFRR(ctx, n, self, local, stateDir); err != nil && !frrUnreachable(err) {
		return err
	}
	// FRR not answering is Check's to report, and EnsureFRR's to retry:
	// the network's services run meanwhile.
	return nil
}

// EnsureFRR gives FRR n's EVPN configuration (as state dir OwnerDir's)
// if it lacks it, and nothing else of n's: the controller's repair of
// what CheckNetwork found wrong in FRR alone (nettypes.FRRError).
func EnsureFRR(ctx context.Context, n *api.Network) error {
	if n.VXLAN == nil || n.VXLAN.EVPN == nil || hostnet.OwnerDir() == "" {
		return nil
	}
	idx, local, err := LocalHost(n)
	if err != nil {
		return err
	}
	return ensureFRR(ctx, n, idx, local, hostnet.OwnerDir())
}

// ensureFRR is ensureEVPN's part in FRR, for state dir stateDir.
func ensureFRR(ctx context.Context, n *api.Network, self int, local netip.Addr, stateDir string) error {
	file := FRRConfigFile(stateDir, n.ID)
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	routers, err := runningBGP(ctx)
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err)
	}
	peers := evpnPeers(n, self)
	if err := evpnConflict(routers, n, local, peers); err != nil {
		return err
	}
	asn := n.VXLAN.EVPN.ASN
	r := routers[asn]
	var marks evpnMarks
	switch {
	case r == nil:
		marks.router = true
	case len(r.vmnetctlGroups()) > 0:
		marks = r.marks() // vmnetctl's, as any owner's group says
	default:
		marks.advertise = !r.advertiseAllVNI
	}
	conf := evpnConfig(n, local, peers, marks)
	if old, err := os.ReadFile(file); err == nil && string(old) == conf {
		// as written before
	} else if err := atomicfile.Write(file, []byte(conf), atomicfile.Options{Perm: 0o644, DirPerm: 0o755}); err != nil {
		return fmt.Errorf("network %q: writing its FRR configuration: %w", n.ID, err)
	}
	members, _ := dirPeers(dir, "")
	if len(evpnDrift(routers, n, peers, members)) == 0 {
		return nil
	}
	if _, err := vtysh(ctx, "-f", file); err != nil {
		return fmt.Errorf("network %q: applying %s: %w", n.ID, file, err)
	}
	if r != nil {
		if s := strangers(r, members); len(s) > 0 {
			args := []string{"-c", "configure terminal", "-c", fmt.Sprintf("router bgp %d", asn)}
			for _, nb := range s {
				args = append(args, "-c", "no neighbor "+nb)
			}
			if _, err := vtysh(ctx, args...); err != nil {
				return fmt.Errorf("network %q: removing neighbors no network has from FRR: %w", n.ID, err)
			}
		}
	}
	routers, err = runningBGP(ctx)
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err)
	}
	if drift := evpnDrift(routers, n, peers, members); len(drift) > 0 {
		return fmt.Errorf("network %q: FRR took %s, and still %s", n.ID, file, strings.Join(drift, ", "))
	}
	return nil
}

// checkEVPN is Check's part for n's EVPN: FRR has n's sessions configured
// (it loses them when it restarts), and the tunnel's bridge port does not
// learn. The forwarding entries are FRR's, and not checked.
func checkEVPN(ctx context.Context, n *api.Network, vx netlink.Link, self int) []error {
	var errs []error
	if p, err := netlink.LinkGetProtinfo(vx); err == nil && p.Learning {
		errs = append(errs, fmt.Errorf("network %q: %s's bridge port learns (FRR's EVPN entries should be its only ones)", n.ID, vx.Attrs().Name))
	}
	routers, err := runningBGP(ctx)
	if err != nil {
		return append(errs, &nettypes.FRRError{Err: fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err), Unreachable: frrUnreachable(err)})
	}
	var members map[string]bool
	if d := hostnet.OwnerDir(); d != "" {
		members, _ = dirPeers(filepath.Dir(FRRConfigFile(d, n.ID)), "")
	}
	if drift := evpnDrift(routers, n, evpnPeers(n, self), members); len(drift) > 0 {
		errs = append(errs, &nettypes.FRRError{Err: fmt.Errorf("network %q: FRR %s (restarted?)", n.ID, strings.Join(drift, ", "))})
	}
	return errs
}

// RemoveEVPN takes network id's segment out of FRR: the members of the
// peer-group that no other network of the state dir (OwnerDir) still has,
// then, with the last network, the group; and with the last vmnetctl group
// of any state dir, what the marks say vmnetctl added: the router, if it
// holds nothing of the user's, else advertise-all-vni. Nothing happens for
// a network without an FRR file; FRR not running has nothing of it
// (vmnetctl never saves it there).
func RemoveEVPN(ctx context.Context, id string) error {
	if d := hostnet.OwnerDir(); d != "" {
		return removeEVPNOf(ctx, d, id)
	}
	return nil
}

// removeEVPNOf is RemoveEVPN for state dir stateDir.
func removeEVPNOf(ctx context.Context, stateDir, id string) error {
	file := FRRConfigFile(stateDir, id)
	mineConf, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("network %q: %w", id, err)
	}
	dir := filepath.Dir(file)
	asn, _ := fileBGP(string(mineConf))
	others, nothers := dirPeers(dir, file)
	routers, err := runningBGP(ctx)
	if errors.Is(err, errNoFRR) {
		routers, err = nil, nil // nothing of ours is there
	}
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", id, err)
	}
	if r := routers[asn]; r != nil {
		if args := removal(r, asn, others, nothers == 0); len(args) > 0 {
			if _, err := vtysh(ctx, args...); err != nil {
				return fmt.Errorf("network %q: removing its BGP sessions from FRR: %w", id, err)
			}
		}
	}
	if nothers == 0 {
		// Marker files of the vmnetctl before the marks moved into FRR.
		legacy, _ := filepath.Glob(filepath.Join(dir, "router-bgp-*.made"))
		more, _ := filepath.Glob(filepath.Join(dir, "advertise-all-vni-*.added"))
		for _, m := range append(legacy, more...) {
			os.Remove(m)
		}
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network %q: %w", id, err)
	}
	return nil
}

// removal is the vtysh arguments that take out of router r (AS asn) the
// members of this state dir's peer-group that others does not have, the
// group itself if last (no other network of the state dir has EVPN), and,
// when it was the router's last vmnetctl group, what its marks say
// vmnetctl added. Each "no" is for what r shows: FRR refuses to remove
// what it does not have. Nil when nothing is to go.
func removal(r *bgpRouter, asn uint32, others map[string]bool, last bool) []string {
	pg := evpnPeerGroup()
	var cmds []string
	for nb, g := range r.neighbors {
		if g == pg && !others[nb] {
			cmds = append(cmds, "no neighbor "+nb)
		}
	}
	slices.Sort(cmds)
	if last && r.groups[pg] {
		rest := slices.DeleteFunc(r.vmnetctlGroups(), func(g string) bool { return g == pg })
		marks := r.marks(pg)
		switch {
		case len(rest) > 0:
			cmds = append(cmds, "no neighbor "+pg+" peer-group")
		case marks.router && r.onlyVmnetctl():
			return []string{"-c", "configure terminal", "-c", fmt.Sprintf("no router bgp %d", asn)}
		case (marks.router || marks.advertise) && r.advertiseAllVNI:
			cmds = append(cmds, "no neighbor "+pg+" peer-group", "address-family l2vpn evpn", "no advertise-all-vni", "exit-address-family")
		default:
			cmds = append(cmds, "no neighbor "+pg+" peer-group")
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	args := []string{"-c", "configure terminal", "-c", fmt.Sprintf("router bgp %d", asn)}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return args
}

// fileBGP reads back the AS and the peers of an FRR file evpnConfig wrote.
func fileBGP(conf string) (asn uint32, peers []string) {
	for _, r := range parseBGP(conf) {
		for nb := range r.neighbors {
			peers = append(peers, nb)
		}
	}
	for a := range parseBGP(conf) {
		asn = a
	}
	return asn, peers
}

// EVPNSessions is the state of the BGP session (as FRR names it:
// Established, Active, Connect...) with each other host of n's segment,
// by underlay address; a host FRR has no session with is missing.
func EVPNSessions(ctx context.Context, n *api.Network) (map[string]string, error) {
	return evpnSessionsIn(ctx, frrPathspace(), n)
}

func evpnSessionsIn(ctx context.Context, ns string, n *api.Network) (map[string]string, error) {
	if err := bgpdRunningIn(ctx, ns); err != nil {
		return nil, err
	}
	out, err := vtyshIn(ctx, ns, "-c", "show bgp l2vpn evpn summary json")
	if err != nil {
		return nil, err
	}
	var sum struct {
		Peers map[string]struct {
			State string `json:"state"`
		} `json:"peers"`
	}
	if strings.TrimSpace(out) != "" && strings.TrimSpace(out) != "{}" {
		if err := json.Unmarshal([]byte(out), &sum); err != nil {
			return nil, fmt.Errorf("reading FRR's l2vpn evpn summary: %w", err)
		}
	}
	states := map[string]string{}
	for _, h := range n.VXLAN.Hosts {
		if p, ok := sum.Peers[h.Address.String()]; ok {
			states[h.Address.String()] = p.State
		}
	}
	return states, nil
}

// sessionMaxAge is how old the sessions that status and the metrics show
// may be.
var sessionMaxAge = 2 * time.Second

// sessionCache holds the latest read of each network's sessions, by FRR
// instance and network: status and the metrics, which the controller
// gathers under its lock, take them from here, not from vtysh, which FRR
// stopped or hung keeps waiting.
var sessionCache = struct {
	sync.Mutex
	m map[string]*sessionRead
}{m: map[string]*sessionRead{}}

// sessionRead is one read of a network's sessions; done is closed when it
// has ended.
type sessionRead struct {
	at       time.Time
	sessions map[string]string
	err      error
	done     chan struct{}
}

// cachedSessions is EVPNSessions as last read, read again in the
// background once older than sessionMaxAge; the very first read is awaited
// for a second at most (nil, nil: not read yet).
func cachedSessions(n *api.Network) (map[string]string, error) {
	ns := frrPathspace() // of the caller's thread: the goroutine's may differ
	key := ns + "\x00" + n.ID
	sessionCache.Lock()
	r := sessionCache.m[key]
	if r == nil {
		r = &sessionRead{}
		sessionCache.m[key] = r
	}
	first := r.at.IsZero()
	if r.done == nil && time.Since(r.at) > sessionMaxAge {
		done := make(chan struct{})
		r.done = done
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			s, err := evpnSessionsIn(ctx, ns, n)
			cancel()
			sessionCache.Lock()
			r.at, r.sessions, r.err, r.done = time.Now(), s, err, nil
			sessionCache.Unlock()
			close(done)
		}()
	}
	done := r.done
	sessionCache.Unlock()
	if first && done != nil {
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	sessionCache.Lock()
	defer sessionCache.Unlock()
	return r.sessions, r.err
}
