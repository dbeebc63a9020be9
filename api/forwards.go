package api

import (
	"fmt"
	"net/netip"

	"gopkg.in/yaml.v3"
)

// PortForward exposes ports of a VM on the host, as lima's portForwards
// do (and with lima's keys): connections to HostIP:HostPort (every
// address of the host when HostIP is 0.0.0.0) go to the VM's address on
// the attachment's network, at GuestPort. A range maps port for port.
type PortForward struct {
	Proto string `json:"proto"` // tcp or udp
	// HostIP is 127.0.0.1 unless set (lima's default: the host's own
	// programs only); 0.0.0.0 is every address of the host.
	HostIP    netip.Addr `json:"hostIP"`
	HostPort  PortRange  `json:"hostPort"`
	GuestPort PortRange  `json:"guestPort"`
	Source    Source     `json:"source"`
}

// PortRange is First..Last, one port when they are equal.
type PortRange struct {
	First int `json:"first"`
	Last  int `json:"last"`
}

func (r PortRange) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Len is the number of ports.
func (r PortRange) Len() int { return r.Last - r.First + 1 }

func (r PortRange) overlaps(o PortRange) bool { return r.First <= o.Last && o.First <= r.Last }

// String is the forward as `plan` and `status` show it.
func (f PortForward) String() string {
	return fmt.Sprintf("%s:%s -> %s/%s", f.HostIP, f.HostPort, f.GuestPort, f.Proto)
}

// MaxForwardPorts bounds the ports one forward maps: each is a kernel
// map element.
const MaxForwardPorts = 1024

var forwardKeys = []string{"guestPort", "guestPortRange", "hostPort", "hostPortRange", "hostIP", "proto"}

// forwards reads an attachment's `portForwards` list.
func (w *walker) forwards(v *yaml.Node, path string) []PortForward {
	v = deref(v)
	if v.Kind != yaml.SequenceNode {
		w.errorf(v, path, "must be a list of forwards like `- {guestPort: 80, hostPort: 8080}`, not %s", kindName(v))
		return nil
	}
	var out []PortForward
	for i, item := range v.Content {
		item = deref(item)
		p := fmt.Sprintf("%s[%d]", path, i)
		f, _, ok := w.collect(item, p, forwardKeys)
		if !ok {
			continue
		}
		at := func(k string) string { return joinPath(p, k) }
		errsBefore := len(w.diags.Errors())
		pf := PortForward{Proto: "tcp", HostIP: netip.AddrFrom4([4]byte{127, 0, 0, 1}), Source: Source{File: w.file, Line: item.Line}}
		guest, gok := w.portRange(f, "guestPort", "guestPortRange", at)
		if !gok {
			if f["guestPort"] == nil && f["guestPortRange"] == nil {
				w.errorf(item, p, "needs guestPort or guestPortRange")
			}
			continue
		}
		pf.GuestPort = guest
		pf.HostPort = guest // lima's default: the same port on the host
		if host, ok := w.portRange(f, "hostPort", "hostPortRange", at); ok {
			pf.HostPort = host
		}
		if pf.HostPort.Len() != pf.GuestPort.Len() {
			w.errorf(item, p, "maps %d host ports onto %d guest ports: the ranges must be as long", pf.HostPort.Len(), pf.GuestPort.Len())
		}
		if pf.GuestPort.Len() > MaxForwardPorts {
			w.errorf(item, p, "forwards %d ports; at most %d in one forward", pf.GuestPort.Len(), MaxForwardPorts)
		}
		field(w, f, at, "hostIP", w.ipv4, &pf.HostIP, nil)
		field(w, f, at, "proto", w.str, &pf.Proto, func(s string, invalid func(string, ...any)) {
			if s != "tcp" && s != "udp" {
				invalid("must be tcp or udp, not %q%s", s, suggest(s, []string{"tcp", "udp"}))
			}
		})
		if len(w.diags.Errors()) == errsBefore {
			out = append(out, pf)
		}
	}
	return out
}

// portRange reads key (one port) or rangeKey ([first, last]), not both.
func (w *walker) portRange(f map[string]*yaml.Node, key, rangeKey string, at func(string) string) (PortRange, bool) {
	one, list := f[key], f[rangeKey]
	switch {
	case one != nil && list != nil:
		w.errorf(list, at(rangeKey), "conflicts with %s: give one", key)
		return PortRange{}, false
	case one != nil:
		port, ok := w.integer(one, at(key))
		if ok && (port < 1 || port > 65535) {
			w.errorf(one, at(key), "%d is not a port (1-65535)", port)
			return PortRange{}, false
		}
		return PortRange{port, port}, ok
	case list != nil:
		list = deref(list)
		if list.Kind != yaml.SequenceNode || len(list.Content) != 2 {
			w.errorf(list, at(rangeKey), "must be [first, last]")
			return PortRange{}, false
		}
		a, ok1 := w.integer(list.Content[0], at(rangeKey)+"[0]")
		b, ok2 := w.integer(list.Content[1], at(rangeKey)+"[1]")
		if !ok1 || !ok2 {
			return PortRange{}, false
		}
		if a < 1 || b > 65535 || a > b {
			w.errorf(list, at(rangeKey), "[%d, %d] is not a range of ports (1-65535, first <= last)", a, b)
			return PortRange{}, false
		}
		return PortRange{a, b}, true
	}
	return PortRange{}, false
}

// servicePortClash says why pf would take the connections of vmnetctl's
// own services: the DNS proxy (53) and DHCP (67) answer on every network's
// gateway, which a forward on every address (or on a gateway) includes.
// "" when it does not.
func servicePortClash(nets *Networks, pf PortForward) string {
	for _, n := range nets.Networks {
		if n.Routed() && n.Gateway.IsValid() && pf.HostIP == n.Gateway {
			return fmt.Sprintf("hostIP %s is the gateway of network %q, its VMs' router: forward from another address of the host", pf.HostIP, n.ID)
		}
	}
	if !pf.HostIP.IsUnspecified() {
		return ""
	}
	for _, s := range []struct {
		port  int
		proto string
		what  string
	}{{53, "udp", "DNS proxy"}, {53, "tcp", "DNS proxy"}, {67, "udp", "DHCP server"}} {
		if pf.Proto == s.proto && pf.HostPort.overlaps(PortRange{s.port, s.port}) {
			return fmt.Sprintf("host port %d/%s on every address (0.0.0.0) would take the connections of vmnetctl's %s on the networks' gateways: give hostIP one address", s.port, s.proto, s.what)
		}
	}
	return ""
}

// conflicts reports whether two forwards claim a host port in common.
func (f PortForward) conflicts(o PortForward) bool {
	sameIP := f.HostIP == o.HostIP || f.HostIP.IsUnspecified() || o.HostIP.IsUnspecified()
	return f.Proto == o.Proto && sameIP && f.HostPort.overlaps(o.HostPort)
}
