package netplane

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
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
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
// it, and the next Ensure (from Check's drift) applies it again. Remove
// takes out the members no other network of the state dir still needs,
// then the group, and `router bgp ASN` itself (or advertise-all-vni) only
// if vmnetctl made it (the markers routerMarker and advertiseMarker): a
// user's own FRR configuration is left as it was.

// evpnPeerGroup is the BGP peer-group of this state dir's EVPN sessions:
// "vmnetctl", and the owner's tag when there is one.
func evpnPeerGroup() string {
	if o := Owner(); o != "" {
		return "vmnetctl-" + o
	}
	return "vmnetctl"
}

// evpnDescription is the description of evpnPeerGroup: whose it is.
func evpnDescription() string {
	if o := Owner(); o != "" {
		return aliasPrefix + "evpn@" + o
	}
	return aliasPrefix + "evpn"
}

// frrPathspace is the FRR instance vmnetctl talks to: FRR's convention
// (frrinit.sh start NS, the daemons' -N NS) is one instance per network
// namespace, named as the namespace, with its sockets under
// /var/run/frr/NS; a vmnetctl running in a named namespace (as `ip netns
// identify` names it) uses that one, else the host's ("").
func frrPathspace() string {
	var self unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &self); err != nil {
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

// errNoFRR: FRR's vtysh is not installed, or no daemon of the instance
// answers it.
var errNoFRR = errors.New("FRR is not running")

// vtysh runs FRR's vtysh on this host's (or namespace's) instance with
// args and returns its output.
func vtysh(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if ns := frrPathspace(); ns != "" {
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
	case err != nil && strings.Contains(stderr.String()+stdout.String(), "failed to connect"):
		return "", fmt.Errorf("%w%s: vtysh reaches no daemon (start zebra and bgpd)", errNoFRR, pathspaceNote())
	case err != nil:
		if len(msgs) > 5 {
			msgs = msgs[:5]
		}
		return stdout.String(), fmt.Errorf("vtysh%s %s: %v: %s", pathspaceNote(), strings.Join(args, " "), err, strings.Join(msgs, "; "))
	}
	return stdout.String(), nil
}

func pathspaceNote() string {
	if ns := frrPathspace(); ns != "" {
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
	// evpnActive are the neighbors and groups active in l2vpn evpn.
	evpnActive      map[string]bool
	advertiseAllVNI bool
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
					r = &bgpRouter{neighbors: map[string]string{}, groups: map[string]bool{}, evpnActive: map[string]bool{}}
					routers[uint32(asn)] = r
					af = ""
				}
			}
			continue
		}
		if r == nil || len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "address-family":
			af = strings.Join(f[1:], " ")
		case f[0] == "exit-address-family":
			af = ""
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
		case af == "l2vpn evpn" && len(f) == 3 && f[0] == "neighbor" && f[2] == "activate":
			r.evpnActive[f[1]] = true
		case af == "l2vpn evpn" && len(f) == 1 && f[0] == "advertise-all-vni":
			r.advertiseAllVNI = true
		}
	}
	return routers
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
// underlay address local: its header marks it as vmnetctl's and n's;
// routerID says whether vmnetctl made (or makes) the router, and so sets
// its id.
func evpnConfig(n *api.Network, local netip.Addr, peers []netip.Addr, routerID bool) string {
	pg := evpnPeerGroup()
	var b strings.Builder
	fmt.Fprintf(&b, "! %s: FRR configuration of network %s's VXLAN segment (VNI %d), written by vmnetctl,\n", Mark(n.ID), n.ID, n.VXLAN.VNI)
	fmt.Fprintf(&b, "! applied with vtysh and removed by vmnetctl down; edit networks.yaml, not this file.\n")
	fmt.Fprintf(&b, "router bgp %d\n", n.VXLAN.EVPN.ASN)
	if routerID {
		fmt.Fprintf(&b, " bgp router-id %s\n", local)
	}
	fmt.Fprintf(&b, " neighbor %s peer-group\n neighbor %s remote-as internal\n neighbor %s description %s\n", pg, pg, pg, evpnDescription())
	for _, p := range peers {
		fmt.Fprintf(&b, " neighbor %s peer-group %s\n", p, pg)
	}
	fmt.Fprintf(&b, " address-family ipv4 unicast\n  no neighbor %s activate\n exit-address-family\n", pg)
	fmt.Fprintf(&b, " address-family l2vpn evpn\n  neighbor %s activate\n  advertise-all-vni\n exit-address-family\nexit\n", pg)
	return b.String()
}

// evpnConflict tells what in FRR's routers keeps n's segment from being
// configured: BGP running with another AS, a router id that is not this
// host's underlay address, or a neighbor of the segment that the user
// configured outside vmnetctl's peer-group.
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
	for _, p := range peers {
		if g, ok := r.neighbors[p.String()]; ok && g != evpnPeerGroup() {
			return fmt.Errorf("network %q: FRR's router bgp %d already has the neighbor %s, configured outside vmnetctl (peer-group %q): remove it (no neighbor %s) so that vmnetctl can peer with that host", n.ID, asn, p, g, p)
		}
	}
	return nil
}

// evpnDrift is what FRR's running configuration lacks of n's segment.
func evpnDrift(routers map[uint32]*bgpRouter, n *api.Network, peers []netip.Addr) []string {
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
	if !r.evpnActive[pg] {
		out = append(out, pg+" is not active for l2vpn evpn")
	}
	if !r.advertiseAllVNI {
		out = append(out, "does not advertise-all-vni")
	}
	return out
}

// routerMarker is the file in dir that says vmnetctl made router bgp asn,
// and so removes it with the last of its segments; advertiseMarker says it
// added advertise-all-vni to a router of the user's.
func routerMarker(dir string, asn uint32) string {
	return filepath.Join(dir, fmt.Sprintf("router-bgp-%d.made", asn))
}

func advertiseMarker(dir string, asn uint32) string {
	return filepath.Join(dir, fmt.Sprintf("advertise-all-vni-%d.added", asn))
}

// ensureEVPN gives FRR n's segment (and takes vx's bridge port's learning
// off: FRR's entries are the only ones).
func ensureEVPN(ctx context.Context, n *api.Network, vx netlink.Link, self int, local netip.Addr) error {
	if p, err := netlink.LinkGetProtinfo(vx); err != nil || p.Learning {
		if err := netlink.LinkSetLearning(vx, false); err != nil {
			return fmt.Errorf("network %q: turning learning off on %s's bridge port: %w", n.ID, vx.Attrs().Name, err)
		}
	}
	stateDir := OwnerDir()
	if stateDir == "" {
		return fmt.Errorf("network %q: EVPN needs a state dir to keep its FRR configuration in", n.ID)
	}
	file := FRRConfigFile(stateDir, n.ID)
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("network %q: %w", n.ID, err)
	}
	running, err := vtysh(ctx, "-c", "show running-config")
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err)
	}
	routers := parseBGP(running)
	peers := evpnPeers(n, self)
	if err := evpnConflict(routers, n, local, peers); err != nil {
		return err
	}
	asn := n.VXLAN.EVPN.ASN
	r := routers[asn]
	// Marked before it is made: a crash between the two leaves a marker
	// that the next removal honours (the router is there, or nothing is).
	if r == nil {
		if err := os.WriteFile(routerMarker(dir, asn), nil, 0o644); err != nil {
			return fmt.Errorf("network %q: %w", n.ID, err)
		}
	} else if !r.advertiseAllVNI && !fileExists(routerMarker(dir, asn)) {
		if err := os.WriteFile(advertiseMarker(dir, asn), nil, 0o644); err != nil {
			return fmt.Errorf("network %q: %w", n.ID, err)
		}
	}
	conf := evpnConfig(n, local, peers, fileExists(routerMarker(dir, asn)))
	if old, err := os.ReadFile(file); err == nil && string(old) == conf {
		// as written before
	} else if err := writeFileAtomic(file, []byte(conf)); err != nil {
		return fmt.Errorf("network %q: writing its FRR configuration: %w", n.ID, err)
	}
	if len(evpnDrift(routers, n, peers)) == 0 {
		return nil
	}
	if _, err := vtysh(ctx, "-f", file); err != nil {
		if r == nil {
			// Not made after all: a router the user makes later is theirs.
			if out, rerr := vtysh(ctx, "-c", "show running-config"); rerr == nil && parseBGP(out)[asn] == nil {
				os.Remove(routerMarker(dir, asn))
			}
		}
		return fmt.Errorf("network %q: applying %s: %w", n.ID, file, err)
	}
	running, err = vtysh(ctx, "-c", "show running-config")
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err)
	}
	if drift := evpnDrift(parseBGP(running), n, peers); len(drift) > 0 {
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
	running, err := vtysh(ctx, "-c", "show running-config")
	if err != nil {
		return append(errs, fmt.Errorf("network %q: reading FRR's configuration: %w", n.ID, err))
	}
	if drift := evpnDrift(parseBGP(running), n, evpnPeers(n, self)); len(drift) > 0 {
		errs = append(errs, fmt.Errorf("network %q: FRR %s (restarted?)", n.ID, strings.Join(drift, ", ")))
	}
	return errs
}

// removeEVPN takes network id's segment out of FRR: the members of the
// peer-group that no other network of the state dir (OwnerDir) still has, then, with the
// last network, the group, and the router or its advertise-all-vni if
// vmnetctl added them. Nothing happens for a network without an FRR file;
// FRR not running has nothing of it (vmnetctl never saves it there).
func removeEVPN(ctx context.Context, id string) error {
	if d := OwnerDir(); d != "" {
		return removeEVPNOf(ctx, d, id)
	}
	return nil
}

// removeEVPNOf is removeEVPN for state dir stateDir.
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
	others := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.conf"))
	for _, f := range files {
		if f == file {
			continue
		}
		b, _ := os.ReadFile(f)
		_, peers := fileBGP(string(b))
		for _, p := range peers {
			others[p] = true
		}
	}
	last := len(files) <= 1
	running, err := vtysh(ctx, "-c", "show running-config")
	if errors.Is(err, errNoFRR) {
		running, err = "", nil // nothing of ours is there
	}
	if err != nil {
		return fmt.Errorf("network %q: reading FRR's configuration: %w", id, err)
	}
	pg := evpnPeerGroup()
	var cmds []string
	if r := parseBGP(running)[asn]; r != nil {
		var foreign bool
		for nb, g := range r.neighbors {
			if g == pg && !others[nb] {
				cmds = append(cmds, "no neighbor "+nb)
			}
			foreign = foreign || g != pg
		}
		slices.Sort(cmds)
		dropRouter := false
		switch {
		case !last:
		case fileExists(routerMarker(dir, asn)) && !foreign && (len(r.groups) == 0 || len(r.groups) == 1 && r.groups[pg]):
			dropRouter = true // vmnetctl's router, with nothing of the user's in it
		case fileExists(advertiseMarker(dir, asn)):
			cmds = append(cmds, "no neighbor "+pg+" peer-group", "address-family l2vpn evpn", "no advertise-all-vni", "exit-address-family")
		case r.groups[pg]:
			cmds = append(cmds, "no neighbor "+pg+" peer-group")
		}
		args := []string{"-c", "configure terminal"}
		if dropRouter {
			args = append(args, "-c", fmt.Sprintf("no router bgp %d", asn))
		} else if len(cmds) > 0 {
			args = append(args, "-c", fmt.Sprintf("router bgp %d", asn))
			for _, c := range cmds {
				args = append(args, "-c", c)
			}
		}
		if len(args) > 2 {
			if _, err := vtysh(ctx, args...); err != nil {
				return fmt.Errorf("network %q: removing its BGP sessions from FRR: %w", id, err)
			}
		}
	}
	if last {
		for _, m := range []string{routerMarker(dir, asn), advertiseMarker(dir, asn)} {
			if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("network %q: %w", id, err)
			}
		}
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network %q: %w", id, err)
	}
	return nil
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
	out, err := vtysh(ctx, "-c", "show bgp l2vpn evpn summary json")
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

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
