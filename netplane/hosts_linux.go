package netplane

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vmnetctl/vmnetctl/leases"
	"github.com/vmnetctl/vmnetctl/nd6"
)

// hostTable maps VMs' MAC addresses to their names for the DNS proxy.
type hostTable struct {
	mu     sync.Mutex
	byMAC  map[string]string
	byName map[string]string // lower-case name → MAC
	// reserved are the names VM files define on any network of the
	// state dir (lower case): on a network where that VM is not, its name
	// is still no DHCP client's.
	reserved map[string]bool
}

// reserve makes names the VM files' names.
func (t *hostTable) reserve(names []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reserved = make(map[string]bool, len(names))
	for _, n := range names {
		t.reserved[strings.ToLower(n)] = true
	}
}

// changeReserved adds the names added to the VM files' names and takes
// those removed off.
func (t *hostTable) changeReserved(added, removed []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reserved == nil {
		t.reserved = map[string]bool{}
	}
	for _, n := range removed {
		delete(t.reserved, strings.ToLower(n))
	}
	for _, n := range added {
		t.reserved[strings.ToLower(n)] = true
	}
}

func (t *hostTable) isReserved(name string) bool {
	name = strings.ToLower(name)
	if slices.Contains(neverDHCPNames, name) {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reserved[name]
}

// neverDHCPNames are names no DHCP client is given, whatever host name it
// sends: what other guests look up on their own (web proxy
// auto-discovery, ISATAP; the global query block list of Windows' DNS
// server) and localhost.
var neverDHCPNames = []string{"wpad", "isatap", "localhost"}

func (t *hostTable) set(mac net.HardwareAddr, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := mac.String()
	if old, ok := t.byMAC[m]; ok && t.byName[strings.ToLower(old)] == m {
		// Only if the name is still this MAC's: another MAC may have taken it since.
		delete(t.byName, strings.ToLower(old))
	}
	if name == "" {
		delete(t.byMAC, m)
		return
	}
	t.byMAC[m] = name
	t.byName[strings.ToLower(name)] = m
}

// macs returns the MACs that have a name.
func (t *hostTable) macs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.byMAC))
	for m := range t.byMAC {
		out = append(out, m)
	}
	return out
}

func (t *hostTable) mac(name string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.byName[strings.ToLower(name)]
	return m, ok
}

// resolver answers names for the DNS proxy: VM names the controller set
// (from the VM files) first, then the host names DHCP clients sent.
//
// A name the controller set is answered from that VM alone (its fixed
// address, else its current lease) and never from a DHCP host name, even
// while the VM has no address: a guest that sends the host name "db" must
// not take the name of the VM file's "db", whether "db" is running or not,
// nor on a network "db" is not on (hostTable.reserved).
func resolver(hosts *hostTable, alloc *leases.Allocator) func(string) (netip.Addr, bool) {
	return func(name string) (netip.Addr, bool) {
		if alloc == nil {
			return netip.Addr{}, false
		}
		if m, ok := hosts.mac(name); ok {
			hw, _ := net.ParseMAC(m)
			if ip, ok := alloc.Fixed(hw); ok {
				return ip, true
			}
			if l, ok := alloc.Lookup(hw); ok {
				return l.IP, true
			}
			return netip.Addr{}, false
		}
		if hosts.isReserved(name) { // another network's VM's
			return netip.Addr{}, false
		}
		// A client may send a full name; its first label is its name here.
		if l, ok := alloc.ByHostname(name); ok {
			return l.IP, true
		}
		return netip.Addr{}, false
	}
}

// resolver6 answers AAAA for the DNS proxy: the IPv6 addresses the guard
// learned for the MAC of a name (a VM file's name, else a DHCP client's
// host name), as resolver decides which MAC a name is.
func resolver6(hosts *hostTable, alloc *leases.Allocator, learner *nd6.Learner) func(string) []netip.Addr {
	return func(name string) []netip.Addr {
		if learner == nil {
			return nil
		}
		if m, ok := hosts.mac(name); ok {
			hw, _ := net.ParseMAC(m)
			return learner.Lookup(hw)
		}
		if alloc == nil || hosts.isReserved(name) {
			return nil
		}
		if l, ok := alloc.ByHostname(name); ok {
			hw, _ := net.ParseMAC(l.MAC)
			return learner.Lookup(hw)
		}
		return nil
	}
}

func newHostTable() *hostTable {
	return &hostTable{byMAC: map[string]string{}, byName: map[string]string{}}
}
