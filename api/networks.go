package api

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
)

// Section is the part of networks.yaml a network was defined in.
type Section string

const (
	// SectionNetworks is lima's classic `networks:` map (socket_vmnet era).
	SectionNetworks Section = "networks"
	// SectionVMNet is lima's newer `vmnet:` section (lima PR 4394).
	SectionVMNet Section = "vmnet"
)

// Mode is how a network reaches the world.
type Mode string

const (
	// ModeShared is NAT to the outside, with DHCP and DNS from vmnetctl.
	ModeShared Mode = "shared"
	// ModeHost is a host-only network: VMs and the host, nothing beyond.
	ModeHost Mode = "host"
	// ModeBridged puts VMs on the LAN of a host interface at layer 2.
	ModeBridged Mode = "bridged"
	// ModeUserV2 is lima's user-mode network; vmnetctl shows it but does not manage it.
	ModeUserV2 Mode = "user-v2"
)

// Defaults that lima documents and that vmnetctl applies.
const (
	DefaultMTU       = 1500
	DefaultNetmask   = "255.255.255.0"
	MinMTU           = 68
	MaxMTU           = 65535
	DefaultLeaseTime = 600 * time.Second
	minLeaseTime     = 10 * time.Second
	maxLeaseTime     = 365 * 24 * time.Hour
)

// Source locates where something was defined.
type Source struct {
	File string `json:"file"`
	Line int    `json:"line"`
}

func (s Source) String() string {
	if s.Line == 0 {
		return s.File
	}
	return fmt.Sprintf("%s:%d", s.File, s.Line)
}

// Reservation pins a MAC address to a fixed IPv4 address.
type Reservation struct {
	MAC  string     `json:"mac"`
	IP   netip.Addr `json:"ip"`
	Line int        `json:"-"`
}

// Network is one network of networks.yaml with every default applied.
type Network struct {
	// ID is how vmnetctl names the network everywhere (status, state, --network).
	// It is the YAML name, except for a `networks:` entry whose name a
	// `vmnet:` entry also uses: that one is "lima-NAME".
	ID      string  `json:"name"`
	Name    string  `json:"yamlName"`
	Section Section `json:"section"`
	Mode    Mode    `json:"mode"`
	// OnDemand is the definition, as networks.yaml text, of a network
	// made on demand (OnDemandNetwork); nil for one of networks.yaml.
	OnDemand []byte `json:"-"`

	// Subnet, Gateway and the DHCP range are set for shared, host and user-v2.
	Subnet    netip.Prefix `json:"subnet,omitzero"`
	Gateway   netip.Addr   `json:"gateway,omitzero"`
	DHCPStart netip.Addr   `json:"dhcpStart,omitzero"`
	DHCPEnd   netip.Addr   `json:"dhcpEnd,omitzero"`
	// Subnet6 is the IPv6 /64 of a shared or host network (`subnet6`, else
	// ULAPrefix of its id; invalid with `ipv6: false`); Gateway6 is ::1 of
	// it, on the bridge.
	Subnet6  netip.Prefix `json:"subnet6,omitzero"`
	Gateway6 netip.Addr   `json:"gateway6,omitzero"`
	// Egress is the network's policy for connections its VMs open; nil
	// allows everything the mode allows.
	Egress *Egress `json:"egress,omitempty"`
	// Partitions, if set, cut the network's VMs in groups that reach no
	// other group's (Linux: the guard drops what passes between them).
	Partitions Partitions `json:"partitions,omitempty"`
	// VXLAN joins the network's bridges on several hosts into one
	// segment; nil for a network of this host alone.
	VXLAN *VXLAN `json:"vxlan,omitempty"`
	// Interface is the host interface of a bridged network.
	Interface string `json:"interface,omitempty"`

	MTU      int  `json:"mtu"`
	DHCP     bool `json:"dhcp"`
	DNSProxy bool `json:"dnsProxy"`
	// DNSForward lets the DNS proxy forward names other than the network's
	// own to the host's resolvers. nil means the mode's default (see
	// ForwardsDNS); LoadNetworks always sets it for shared and host.
	DNSForward          *bool `json:"dnsForward,omitempty"`
	NAT44               bool  `json:"nat44"`
	NAT66               bool  `json:"nat66"`
	RouterAdvertisement bool  `json:"routerAdvertisement"`
	Isolation           bool  `json:"isolation"`
	// Offloads turns on TSO and checksum offload in every helper of the
	// network (datagrams then carry a virtio-net header: the VMM must
	// support it). vmnet loses TSO for all VMs of a network when one lacks it.
	Offloads bool `json:"offloads"`
	// NoAddressLearning is `learnAddresses: false`: a VM may send only from
	// the IPv4 addresses DHCP gave it or a file fixes for it. By default a
	// VM that gives itself a free address of the subnet (a static
	// address) is let use it once it announces it by ARP (the guard's
	// learner; docs/security.md).
	NoAddressLearning bool `json:"noAddressLearning,omitempty"`
	// Socket serves a stream socket for the network (socket_vmnet's way,
	// lima's `socket:` networks): any VMM that connects to it gets a port
	// of its own on the network, guarded, its MAC learned
	// (statedir.Dir.NetworkSocketPath; docs/vmms.md).
	Socket bool `json:"socket,omitempty"`
	// VMNetBroker joins the vmnet-broker network of that name on macOS 26
	// (vmnet-helper --network) instead of creating one from this definition.
	VMNetBroker  string        `json:"vmnetBroker,omitempty"`
	LeaseTime    time.Duration `json:"-"`
	Reservations []Reservation `json:"reservations"`
	Source       Source        `json:"source"`

	lines  map[string]int
	noIPv6 bool // `ipv6: false`
}

// Managed reports whether vmnetctl runs this network (user-v2 is lima's own).
func (n *Network) Managed() bool { return n.Mode != ModeUserV2 }

// Routed reports whether vmnetctl owns the network's addresses (shared or host).
func (n *Network) Routed() bool { return n.Mode == ModeShared || n.Mode == ModeHost }

// ForwardsDNS reports whether the DNS proxy forwards names that are not
// the network's own: dnsForward when set, else true for shared networks and
// false for host-only ones (their VMs must not reach names outside).
func (n *Network) ForwardsDNS() bool {
	if n.DNSForward != nil {
		return *n.DNSForward
	}
	return n.Mode == ModeShared
}

// Bridge is the Linux bridge vmnetctl creates for a shared or host network.
func (n *Network) Bridge() string {
	if !n.Routed() {
		return ""
	}
	return BridgeName(n.ID)
}

// Paths is networks.yaml's `paths:` section.
type Paths struct {
	SocketVMNet string `json:"socketVMNet,omitempty"`
	VarRun      string `json:"varRun,omitempty"`
	Sudoers     string `json:"sudoers,omitempty"`
	// VMNetHelper is where vmnet-helper is installed (macOS); a vmnetctl key.
	VMNetHelper string `json:"vmnetHelper,omitempty"`
}

// Networks is a loaded networks.yaml.
type Networks struct {
	Source   string     `json:"source"`
	Paths    Paths      `json:"paths"`
	Group    string     `json:"group,omitempty"`
	Networks []*Network `json:"networks"`
}

// Get returns the network with the given ID, or nil.
func (c *Networks) Get(id string) *Network {
	for _, n := range c.Networks {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Lookup resolves a VM file reference: `vmnet: NAME` looks in the vmnet:
// section first, `lima: NAME` in the networks: map first; each falls back to
// the other section, so `- vmnet: shared` works with a classic file.
func (c *Networks) Lookup(kind RefKind, name string) *Network {
	first, second := SectionVMNet, SectionNetworks
	if kind == RefLima {
		first, second = second, first
	}
	for _, s := range []Section{first, second} {
		for _, n := range c.Networks {
			if n.Section == s && n.Name == name {
				return n
			}
		}
	}
	return nil
}

var networkKeys = []string{"mode", "gateway", "dhcpEnd", "netmask", "interface", "subnet", "dhcp",
	"dnsProxy", "dnsForward", "mtu", "nat44", "nat66", "routerAdvertisement", "isolation", "leaseTime", "dhcpRange", "reservations",
	"offloads", "vmnetBroker", "ipv6", "subnet6", "egress", "vxlan", "learnAddresses", "socket", "partitions"}

// LoadNetworks parses networks.yaml. file names the input in diagnostics.
// The result is nil when there are errors.
func LoadNetworks(file string, data []byte) (*Networks, Diagnostics) {
	cfg, _, diags := loadNetworks(file, data)
	if diags.HasErrors() {
		return nil, diags
	}
	return cfg, diags
}

// NetworksThatLoad is, of a networks.yaml with errors, the networks that
// load without any, and the names of those that do not (nil, nil when
// none can be read). `validate` checks the VM files against the first,
// leaving out the entries on the second: an error in one network hides
// only what depends on it.
func NetworksThatLoad(file string, data []byte) (*Networks, []string) {
	cfg, defined, _ := loadNetworks(file, data)
	if cfg == nil {
		return nil, nil
	}
	var broken []string
	for _, name := range defined {
		if cfg.Get(name) == nil {
			broken = append(broken, name)
		}
	}
	return cfg, broken
}

// loadNetworks is LoadNetworks with what it has despite errors: the
// networks without any, and the names of every network the file defines.
func loadNetworks(file string, data []byte) (*Networks, []string, Diagnostics) {
	w := &walker{file: file}
	cfg := &Networks{Source: file}
	var defined []string
	root := w.parse(data)
	if root == nil {
		if !w.diags.HasErrors() {
			w.errorf(nil, "", "defines no networks (expected a `networks:` or `vmnet:` section)")
		}
		return nil, nil, w.diags
	}
	section := func(s Section) fieldFunc {
		return func(_, v *yaml.Node, path string) {
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				return
			}
			w.mapping(v, path, nil, true) // shape check only; entries below
			if v.Kind != yaml.MappingNode {
				return
			}
			for i := 0; i+1 < len(v.Content); i += 2 {
				k, nv := deref(v.Content[i]), deref(v.Content[i+1])
				defined = append(defined, k.Value)
				if n := w.network(s, k, nv, joinPath(path, k.Value)); n != nil {
					cfg.Networks = append(cfg.Networks, n)
				}
			}
		}
	}
	w.mapping(root, "", map[string]fieldFunc{
		"paths": func(_, v *yaml.Node, path string) { w.paths(v, path, &cfg.Paths) },
		"group": func(_, v *yaml.Node, path string) {
			if s, ok := w.str(v, path); ok {
				if msg := checkName(s); msg != "" {
					w.errorf(v, path, "%s", msg)
				}
				cfg.Group = s
			}
		},
		"networks": section(SectionNetworks),
		"vmnet":    section(SectionVMNet),
	}, false)
	w.finishNetworks(cfg)
	return cfg, defined, w.diags
}

func (w *walker) paths(v *yaml.Node, path string, p *Paths) {
	set := func(dst *string) fieldFunc {
		return func(_, v *yaml.Node, path string) {
			if s, ok := w.str(v, path); ok {
				*dst = s
			}
		}
	}
	obsolete := func(k, _ *yaml.Node, path string) {
		w.warnf(k, path, "lima no longer uses VDE; ignored")
	}
	known := map[string]fieldFunc{
		"socketVMNet": set(&p.SocketVMNet),
		"varRun":      set(&p.VarRun),
		"sudoers":     set(&p.Sudoers),
		"vmnetHelper": set(&p.VMNetHelper),
		"vdeSwitch":   obsolete,
		"vdeVMNet":    obsolete,
	}
	// lima keeps adding paths: one vmnetctl does not know is lima's, not
	// a mistake.
	if m := deref(v); m != nil && m.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if k := deref(m.Content[i]); k.Kind == yaml.ScalarNode && known[k.Value] == nil {
				w.warnf(k, joinPath(path, k.Value), "not a path vmnetctl uses; ignored%s", suggest(k.Value, keys(known)))
			}
		}
	}
	w.mapping(v, path, known, true)
}

// collect gathers a mapping's values by key, reporting unknown and duplicate keys.
func (w *walker) collect(n *yaml.Node, path string, allowed []string) (map[string]*yaml.Node, map[string]int, bool) {
	vals := map[string]*yaml.Node{}
	lines := map[string]int{}
	known := map[string]fieldFunc{}
	for _, k := range allowed {
		known[k] = func(key, v *yaml.Node, _ string) {
			vals[key.Value] = v
			lines[key.Value] = key.Line
		}
	}
	ok := w.mapping(n, path, known, false)
	return vals, lines, ok
}

func (w *walker) network(section Section, key, v *yaml.Node, path string) *Network {
	if msg := checkName(key.Value); msg != "" {
		w.errorf(key, path, "network name %s", msg)
		return nil
	}
	if d := deref(v); section == SectionVMNet && d != nil && d.Kind == yaml.ScalarNode && d.Tag == "!!null" {
		// An entry with nothing under it (comments only): every default,
		// as lima reads it.
		v = &yaml.Node{Kind: yaml.MappingNode, Line: d.Line, Column: d.Column}
	}
	f, lines, ok := w.collect(v, path, networkKeys)
	if !ok {
		return nil
	}
	n := &Network{
		ID: key.Value, Name: key.Value, Section: section,
		Source: Source{File: w.file, Line: key.Line},
		MTU:    DefaultMTU, DHCP: true, DNSProxy: true, NAT44: true, NAT66: true, RouterAdvertisement: true,
		LeaseTime: DefaultLeaseTime,
		lines:     lines,
	}
	errsBefore := len(w.diags.Errors())
	at := func(k string) string { return joinPath(path, k) }
	// Mode first: what else is allowed depends on it. An unknown mode
	// hides only what depends on it: the switches and values every mode
	// takes and the addresses are checked all the same, every problem at
	// once.
	if !w.mode(n, key, f, at) {
		scratch := *n
		w.settings(&scratch, f, at)
		_, hasSubnet := f["subnet"]
		_, hasGateway := f["gateway"]
		_, hasMask := f["netmask"]
		if hasSubnet || hasGateway || hasMask {
			w.addresses(&Network{ID: n.ID}, f, at)
		}
		return nil
	}
	w.settings(n, f, at)
	if n.Mode == ModeHost {
		// A host-only network has no way out, so lima ignores these for it
		// (its own example sets nat44: true on a host network); show them
		// off. Router advertisements stay: they give the VMs IPv6
		// addresses, with no default route.
		n.NAT44, n.NAT66 = false, false
	}
	switch n.Mode {
	case ModeBridged:
		w.bridged(n, key, f, at)
	case ModeUserV2:
		w.addresses(n, f, at)
		if xv, ok := f["vxlan"]; ok {
			w.errorf(xv, at("vxlan"), "a user-v2 network is lima's own: it cannot span hosts")
		}
	default:
		w.routed(n, f, at)
	}
	if !n.Routed() {
		// vmnetctl serves no DHCP, DNS or NAT on a bridged network (the LAN
		// does) nor on lima's user-v2; say so rather than show lima's defaults.
		n.DHCP, n.DNSProxy, n.NAT44, n.NAT66, n.RouterAdvertisement = false, false, false, false, false
		n.DNSForward = nil
		n.NoAddressLearning = false
		if sv, ok := f["socket"]; ok && n.Socket {
			w.errorf(sv, at("socket"), "a %s network has no ports of vmnetctl's to give a VMM: socket is for shared and host networks", n.Mode)
		}
		n.Socket = false
	}
	if len(w.diags.Errors()) > errsBefore {
		return nil
	}
	return n
}

// mode reads the network's mode; false when it is missing or unknown.
func (w *walker) mode(n *Network, key *yaml.Node, f map[string]*yaml.Node, at func(string) string) bool {
	switch mv, set := f["mode"]; {
	case set:
		s, ok := w.str(mv, at("mode"))
		if !ok {
			return false
		}
		allowed := []string{string(ModeShared), string(ModeHost), string(ModeBridged)}
		if n.Section == SectionNetworks {
			allowed = append(allowed, string(ModeUserV2))
		}
		if !slices.Contains(allowed, s) {
			w.errorf(mv, at("mode"), "unknown mode %q%s", s, suggest(s, allowed))
			return false
		}
		n.Mode = Mode(s)
	case n.Section == SectionVMNet:
		n.Mode = ModeShared // lima's default for vmnet: entries
	default:
		w.errorf(key, at("mode"), "is required (shared, host, bridged or user-v2)")
		return false
	}
	return true
}

// settings reads the switches and values every mode takes.
func (w *walker) settings(n *Network, f map[string]*yaml.Node, at func(string) string) {
	boolField := func(name string, dst *bool) { field(w, f, at, name, w.boolean, dst, nil) }
	boolField("dhcp", &n.DHCP)
	boolField("dnsProxy", &n.DNSProxy)
	if n.Routed() {
		fwd := n.ForwardsDNS() // the mode's default
		boolField("dnsForward", &fwd)
		n.DNSForward = &fwd
		if fv, ok := f["dnsForward"]; ok && !n.DNSProxy {
			w.warnf(fv, at("dnsForward"), "has no effect with dnsProxy: false")
		}
	}
	boolField("nat44", &n.NAT44)
	boolField("nat66", &n.NAT66)
	boolField("routerAdvertisement", &n.RouterAdvertisement)
	boolField("isolation", &n.Isolation)
	boolField("offloads", &n.Offloads)
	learn := true
	boolField("learnAddresses", &learn)
	n.NoAddressLearning = !learn
	boolField("socket", &n.Socket)
	field(w, f, at, "vmnetBroker", w.str, &n.VMNetBroker, func(b string, invalid func(string, ...any)) {
		if msg := checkName(b); msg != "" {
			invalid("vmnet-broker network name %s", msg)
		}
	})
	field(w, f, at, "mtu", w.integer, &n.MTU, func(m int, invalid func(string, ...any)) {
		if m < MinMTU || m > MaxMTU {
			invalid("%d is outside %d-%d", m, MinMTU, MaxMTU)
		}
	})
	if lv, ok := f["leaseTime"]; ok {
		n.LeaseTime = w.duration(lv, at("leaseTime"))
	}
}

// bridged reads what a bridged network takes: its interface, and no
// addresses or services (the LAN has them).
func (w *walker) bridged(n *Network, key *yaml.Node, f map[string]*yaml.Node, at func(string) string) {
	for _, k := range []string{"gateway", "netmask", "subnet", "dhcpEnd", "dhcpRange", "reservations", "subnet6", "egress", "vxlan", "partitions"} {
		if _, ok := f[k]; ok {
			w.errorf(f[k], at(k), "a bridged network has no %s: its VMs take their addresses from the LAN of its interface", k)
		}
	}
	for _, k := range []string{"dhcp", "dnsProxy", "dnsForward", "nat44", "nat66", "routerAdvertisement", "leaseTime", "ipv6"} {
		if _, ok := f[k]; ok {
			w.warnf(f[k], at(k), "ignored for a bridged network: the LAN provides it")
		}
	}
	iv, ok := f["interface"]
	if !ok {
		w.errorf(key, at("interface"), "is required for a bridged network (the host interface to bridge onto)")
		return
	}
	if s, ok := w.str(iv, at("interface")); ok {
		switch msg := checkIfName(s); {
		case msg != "":
			w.errorf(iv, at("interface"), "%s", msg)
		case s == "lo":
			w.errorf(iv, at("interface"), "lo is the loopback interface: nothing can be bridged onto it")
		case OwnInterface(s):
			w.errorf(iv, at("interface"), "%s is a name of vmnetctl's own interfaces (bridges %s..., VM ports %s..., tunnels %s...): bridge onto the host's LAN interface, or attach the VMs to that network", s, BridgePrefix, TapPrefix, VXLANPrefix)
		}
		n.Interface = s
	}
}

// routed reads a shared or host network's addresses, DHCP range and
// reservations.
func (w *walker) routed(n *Network, f map[string]*yaml.Node, at func(string) string) {
	if iv, ok := f["interface"]; ok {
		w.errorf(iv, at("interface"), "only bridged networks take an interface; %s networks get a bridge of their own", n.Mode)
	}
	w.addresses(n, f, at)
	w.ipv6(n, f, at)
	if ev, ok := f["egress"]; ok {
		w.egress(n, ev, at("egress"))
	}
	if pv, ok := f["partitions"]; ok {
		n.Partitions = w.partitions(pv, at("partitions"))
	}
	if n.Subnet.IsValid() {
		w.dhcpRange(n, f, at)
		w.reservations(n, f, at)
	} else if n.Section == SectionVMNet && f["subnet"] == nil && f["gateway"] == nil {
		for _, k := range []string{"dhcpEnd", "dhcpRange", "reservations"} {
			if v, ok := f[k]; ok {
				w.errorf(v, at(k), "needs the network's subnet; set subnet too")
			}
		}
	}
	if xv, ok := f["vxlan"]; ok {
		w.vxlan(n, xv, at("vxlan"), f["mtu"] != nil)
	}
}

func (w *walker) duration(v *yaml.Node, path string) time.Duration {
	var d time.Duration
	if v.Kind == yaml.ScalarNode {
		if secs, err := strconv.Atoi(v.Value); err == nil {
			d = time.Duration(secs) * time.Second
		} else if pd, err := time.ParseDuration(v.Value); err == nil {
			d = pd
		} else {
			w.errorf(v, path, "%q is not a duration (seconds, or like 10m or 1h)", v.Value)
			return 0
		}
	} else {
		w.errorf(v, path, "must be a duration, not %s", kindName(v))
		return 0
	}
	if d < minLeaseTime || d > maxLeaseTime {
		w.errorf(v, path, "%s is outside %s-%s", d, minLeaseTime, maxLeaseTime)
	}
	return d
}

func (w *walker) ipv4(v *yaml.Node, path string) (netip.Addr, bool) {
	s, ok := w.str(v, path)
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		w.errorf(v, path, "%q is not an IPv4 address", s)
		return netip.Addr{}, false
	}
	return a, true
}

// addresses sets Subnet and Gateway from `subnet` (vmnet style) or
// `gateway` and `netmask` (classic style).
func (w *walker) addresses(n *Network, f map[string]*yaml.Node, at func(string) string) {
	sv, hasSubnet := f["subnet"]
	gv, hasGateway := f["gateway"]
	mv, hasMask := f["netmask"]
	switch {
	case hasSubnet && (hasGateway || hasMask):
		bad := gv
		if !hasGateway {
			bad = mv
		}
		w.errorf(bad, at("subnet"), "give either subnet, or gateway and netmask, not both")
	case hasSubnet:
		s, ok := w.str(sv, at("subnet"))
		if !ok {
			return
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			w.errorf(sv, at("subnet"), "%q is not an IPv4 CIDR like 192.168.107.0/24", s)
			return
		}
		if p.Bits() < 8 || p.Bits() > 30 {
			w.errorf(sv, at("subnet"), "%q: the prefix length must be between 8 and 30", s)
			return
		}
		if msg := checkSubnet(p.Masked()); msg != "" {
			w.errorf(sv, at("subnet"), "%s", msg)
			return
		}
		n.Subnet = p.Masked()
		// lima normalises a subnet to its first host address as the gateway;
		// an address with host bits set names the gateway itself.
		n.Gateway = p.Addr()
		if n.Gateway == n.Subnet.Addr() {
			n.Gateway = n.Gateway.Next()
		}
		w.checkHost(n, n.Gateway, sv, at("subnet"))
	case hasGateway:
		// The gateway and the netmask are checked each on its own: both
		// wrong, both are reported.
		gw, gwOK := w.ipv4(gv, at("gateway"))
		bits, maskOK := 24, true
		if hasMask {
			m, ok := w.ipv4(mv, at("netmask"))
			if ok {
				b, ok := maskBits(m)
				if !ok || b < 8 || b > 30 {
					w.errorf(mv, at("netmask"), "%s is not a netmask between /8 and /30 (like 255.255.255.0)", m)
					maskOK = false
				}
				bits = b
			} else {
				maskOK = false
			}
		}
		if !gwOK || !maskOK {
			return
		}
		n.Subnet = netip.PrefixFrom(gw, bits).Masked()
		n.Gateway = gw
		if msg := checkSubnet(n.Subnet); msg != "" {
			w.errorf(gv, at("gateway"), "%s", msg)
			return
		}
		w.checkHost(n, gw, gv, at("gateway"))
	case n.Section == SectionVMNet:
		// Left for finishNetworks to pick, as vmnet picks one on macOS.
	default:
		if n.Mode != ModeUserV2 {
			w.errorf(nil, at("gateway"), "is required for a %s network (or give subnet)", n.Mode)
			w.diags[len(w.diags)-1].Line = n.Source.Line
		}
	}
}

// checkSubnet returns why p cannot be a VM network, or "": its addresses
// must be private (RFC 1918), since vmnetctl routes and NATs them as the
// host's own. Loopback, multicast, 0.0.0.0/8, link-local and public ranges
// would take addresses the host or the internet uses.
func checkSubnet(p netip.Prefix) string {
	what := ""
	switch a := p.Addr(); {
	case p.Overlaps(netip.MustParsePrefix("0.0.0.0/8")):
		what = "0.0.0.0/8 (this network, not a usable range)"
	case a.IsLoopback():
		what = "loopback (127.0.0.0/8)"
	case a.IsMulticast():
		what = "multicast (224.0.0.0/4)"
	case a.IsLinkLocalUnicast():
		what = "link-local (169.254.0.0/16)"
	case !p.Overlaps(netip.MustParsePrefix("240.0.0.0/4")) && a.IsPrivate() && p.Bits() >= privateBits(a):
		return ""
	case p.Overlaps(netip.MustParsePrefix("240.0.0.0/4")):
		what = "reserved (240.0.0.0/4)"
	default:
		what = "not a private range"
	}
	return fmt.Sprintf("%s is %s; use a private range: 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16", p, what)
}

// privateBits is the prefix length of the RFC 1918 block holding a: a
// subnet wider than its block reaches outside it.
func privateBits(a netip.Addr) int {
	for _, b := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"} {
		if p := netip.MustParsePrefix(b); p.Contains(a) {
			return p.Bits()
		}
	}
	return 33
}

// checkHost reports an address that is the subnet's network or broadcast address.
func (w *walker) checkHost(n *Network, a netip.Addr, v *yaml.Node, path string) {
	if !n.Subnet.Contains(a) {
		w.errorf(v, path, "%s is outside the subnet %s", a, n.Subnet)
	} else if a == n.Subnet.Addr() {
		w.errorf(v, path, "%s is the network address of %s, not a host address", a, n.Subnet)
	} else if a == broadcast(n.Subnet) {
		w.errorf(v, path, "%s is the broadcast address of %s, not a host address", a, n.Subnet)
	}
}

func (w *walker) dhcpRange(n *Network, f map[string]*yaml.Node, at func(string) string) {
	n.DHCPStart = n.Gateway.Next()
	// lima documents dhcpEnd's default as the gateway with last octet .254;
	// where that is not in the subnet, the last host address is used.
	n.DHCPEnd = broadcast(n.Subnet).Prev()
	g := n.Gateway.As4()
	if lima := netip.AddrFrom4([4]byte{g[0], g[1], g[2], 254}); n.Subnet.Contains(lima) && lima != broadcast(n.Subnet) && n.Gateway.Less(lima) {
		n.DHCPEnd = lima
	}
	endV, startV := f["dhcpEnd"], (*yaml.Node)(nil)
	if ev, ok := f["dhcpEnd"]; ok {
		if a, ok := w.ipv4(ev, at("dhcpEnd")); ok {
			n.DHCPEnd = a
		}
	}
	if rv, ok := f["dhcpRange"]; ok {
		if endV != nil {
			w.errorf(rv, at("dhcpRange"), "give either dhcpEnd or dhcpRange, not both")
			return
		}
		rf, _, ok := w.collect(rv, at("dhcpRange"), []string{"start", "end"})
		if !ok {
			return
		}
		for _, k := range []string{"start", "end"} {
			if _, ok := rf[k]; !ok {
				w.errorf(rv, at("dhcpRange."+k), "is required")
			}
		}
		if sv, ok := rf["start"]; ok {
			if a, ok := w.ipv4(sv, at("dhcpRange.start")); ok {
				n.DHCPStart, startV = a, sv
			}
		}
		if ev, ok := rf["end"]; ok {
			if a, ok := w.ipv4(ev, at("dhcpRange.end")); ok {
				n.DHCPEnd, endV = a, ev
			}
		}
	}
	rangePath := at("dhcpRange")
	if _, ok := f["dhcpEnd"]; ok {
		rangePath = at("dhcpEnd")
	}
	for _, e := range []struct {
		a netip.Addr
		v *yaml.Node
	}{{n.DHCPStart, startV}, {n.DHCPEnd, endV}} {
		if e.v != nil {
			w.checkHost(n, e.a, e.v, rangePath)
		}
	}
	anchor := endV
	if anchor == nil {
		anchor = startV
	}
	if n.DHCPEnd.Less(n.DHCPStart) {
		w.errorf(anchor, rangePath, "the DHCP range %s-%s is reversed", n.DHCPStart, n.DHCPEnd)
	} else if !n.Gateway.Less(n.DHCPStart) && !n.DHCPEnd.Less(n.Gateway) {
		w.errorf(anchor, rangePath, "the DHCP range %s-%s contains the gateway %s", n.DHCPStart, n.DHCPEnd, n.Gateway)
	}
}

func (w *walker) reservations(n *Network, f map[string]*yaml.Node, at func(string) string) {
	rv, ok := f["reservations"]
	if !ok {
		return
	}
	path := at("reservations")
	rv = deref(rv)
	if rv.Kind != yaml.MappingNode {
		w.errorf(rv, path, "must be a mapping of MAC address to IPv4 address, not %s", kindName(rv))
		return
	}
	byIP := map[netip.Addr]int{}
	byMAC := map[string]int{}
	for i := 0; i+1 < len(rv.Content); i += 2 {
		k, v := deref(rv.Content[i]), deref(rv.Content[i+1])
		p := joinPath(path, k.Value)
		hw, msg := parseMAC(k.Value)
		if msg != "" {
			w.errorf(k, p, "%s", msg)
			continue
		}
		mac := hw.String()
		if prev, dup := byMAC[mac]; dup {
			w.errorf(k, p, "MAC %s is reserved twice (first at line %d)", mac, prev)
			continue
		}
		byMAC[mac] = k.Line
		ip, ok := w.ipv4(v, p)
		if !ok {
			continue
		}
		w.checkHost(n, ip, v, p)
		if ip == n.Gateway {
			w.errorf(v, p, "%s is the gateway", ip)
		}
		if prev, dup := byIP[ip]; dup {
			w.errorf(v, p, "%s is reserved twice (first at line %d)", ip, prev)
			continue
		}
		byIP[ip] = v.Line
		n.Reservations = append(n.Reservations, Reservation{MAC: mac, IP: ip, Line: k.Line})
	}
	slices.SortFunc(n.Reservations, func(a, b Reservation) int { return a.IP.Compare(b.IP) })
}

// finishNetworks assigns IDs, picks subnets for vmnet: entries that name
// none, and checks what spans networks: overlaps and bridge names.
func (w *walker) finishNetworks(cfg *Networks) {
	inVMNet := map[string]bool{}
	for _, n := range cfg.Networks {
		if n.Section == SectionVMNet {
			inVMNet[n.Name] = true
		}
	}
	ids := map[string]*Network{}
	for _, n := range cfg.Networks {
		if n.Section == SectionNetworks && inVMNet[n.Name] {
			n.ID = "lima-" + n.Name
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: "networks." + n.Name, Severity: SeverityWarning,
				Message: fmt.Sprintf("a vmnet: network is also named %q; `- lima: %s` refers to this one, which vmnetctl calls %q", n.Name, n.Name, n.ID)})
		}
		if prev, dup := ids[n.ID]; dup {
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name,
				Message: fmt.Sprintf("network name %q is already used at line %d", n.ID, prev.Source.Line)})
		}
		ids[n.ID] = n
	}
	slices.SortFunc(cfg.Networks, func(a, b *Network) int { return cmp.Compare(a.ID, b.ID) })

	// Overlaps among the networks that name their subnet, in file order.
	byLine := slices.Clone(cfg.Networks)
	slices.SortFunc(byLine, func(a, b *Network) int { return cmp.Compare(a.Source.Line, b.Source.Line) })
	var placed []*Network
	for _, n := range byLine {
		if !n.Routed() || !n.Subnet.IsValid() {
			continue
		}
		for _, p := range placed {
			if p.Subnet.Overlaps(n.Subnet) {
				field := string(n.Section) + "." + n.Name + ".subnet"
				line := n.lines["subnet"]
				if line == 0 {
					field, line = string(n.Section)+"."+n.Name+".gateway", n.lines["gateway"]
				}
				w.diags = append(w.diags, Diagnostic{File: w.file, Line: line, Field: field,
					Message: fmt.Sprintf("subnet %s overlaps %s of network %q (line %d)", n.Subnet, p.Subnet, p.ID, p.Source.Line)})
			}
		}
		placed = append(placed, n)
	}
	defaultIPv6(cfg.Networks)
	w.checkIPv6Overlaps(byLine)
	w.checkVXLANs(byLine)
	w.checkWireGuards(byLine)
	// vmnet: entries without a subnet get the first free 192.168.N.0/24 from
	// N=100, in name order, so the choice is stable for a given file.
	for _, n := range cfg.Networks {
		if !n.Routed() || n.Subnet.IsValid() {
			continue
		}
		for third := 100; third < 255; third++ {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(third), 0}), 24)
			if !slices.ContainsFunc(placed, func(o *Network) bool { return o.Subnet.Overlaps(p) }) {
				n.Subnet, n.Gateway = p, p.Addr().Next()
				w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name + ".subnet", Severity: SeverityWarning,
					Message: fmt.Sprintf("no subnet given; using %s (set subnet to keep it fixed)", p)})
				w.dhcpRange(n, nil, func(k string) string { return k })
				placed = append(placed, n)
				break
			}
		}
	}
	bridges := map[string]*Network{}
	for _, n := range cfg.Networks {
		b := n.Bridge()
		if b == "" {
			continue
		}
		if prev, dup := bridges[b]; dup {
			w.diags = append(w.diags, Diagnostic{File: w.file, Line: n.Source.Line, Field: string(n.Section) + "." + n.Name,
				Message: fmt.Sprintf("gets the same bridge name %q as network %q; rename one", b, prev.ID)})
		}
		bridges[b] = n
	}
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

// maskBits turns a dotted netmask into a prefix length; ok is false when the
// mask's ones are not contiguous.
func maskBits(m netip.Addr) (int, bool) {
	b := m.As4()
	v := binary.BigEndian.Uint32(b[:])
	ones := 0
	for v&0x80000000 != 0 {
		ones++
		v <<= 1
	}
	return ones, v == 0
}

// LearnsAddresses reports whether n's guard lets a VM use a free IPv4
// address it gives itself (learnAddresses, on by default): routed networks
// with vmnetctl's DHCP server, whose allocator keeps the addresses, and of
// this host alone (across hosts, each host's allocator knows only its
// slice: an address one learned could be another host's VM's).
func (n *Network) LearnsAddresses() bool {
	return n.Routed() && n.DHCP && !n.NoAddressLearning && n.VXLAN == nil
}
