package netplane

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
)

// leaseFile is the on-disk form of a network's leases.
type leaseFile struct {
	Network string          `json:"network"`
	Subnet  string          `json:"subnet"`
	Leases  []backend.Lease `json:"leases"`
}

// ErrNoAddress is returned when the DHCP range has no address left for a client.
var ErrNoAddress = errors.New("no free address in the DHCP range")

// Allocator hands out a network's addresses: fixed addresses first
// (reservations of networks.yaml, then those the controller sets at run time),
// else the address the MAC had before, else a free one of the DHCP range. It
// remembers every MAC it has seen, expired or not, and reuses an expired
// lease's address for another MAC only when no never-used address is left, so
// a VM keeps its address across restarts of itself and of vmnetctl.
//
// It is safe for concurrent use. With a path, every change is written to it
// atomically (a temporary file renamed over it) before the client hears of it.
type Allocator struct {
	mu        sync.Mutex
	id        string
	subnet    netip.Prefix
	gateway   netip.Addr
	start     netip.Addr
	end       netip.Addr
	leaseTime time.Duration
	path      string
	now       func() time.Time

	leases   map[string]*backend.Lease // by MAC
	fixed    map[string]netip.Addr     // by MAC: reservations and SetFixed
	reserved map[string]bool           // MACs whose fixed address comes from networks.yaml
	declined map[netip.Addr]time.Time  // addresses a client found in use, until when
}

// NewAllocator returns the allocator of a shared or host network, loading the
// leases kept at path (none if path is "" or the file does not exist yet).
// Leases outside the network's subnet, left from an older configuration, are
// dropped.
func NewAllocator(n *api.Network, path string) (*Allocator, error) {
	if !n.Subnet.IsValid() || !n.DHCPStart.IsValid() || !n.DHCPEnd.IsValid() {
		return nil, fmt.Errorf("network %q has no subnet or DHCP range", n.ID)
	}
	lt := n.LeaseTime
	if lt <= 0 {
		lt = api.DefaultLeaseTime
	}
	a := &Allocator{
		id: n.ID, subnet: n.Subnet, gateway: n.Gateway, start: n.DHCPStart, end: n.DHCPEnd,
		leaseTime: lt, path: path, now: time.Now,
		leases: map[string]*backend.Lease{}, fixed: map[string]netip.Addr{}, reserved: map[string]bool{},
		declined: map[netip.Addr]time.Time{},
	}
	for _, r := range n.Reservations {
		mac, err := normMAC(r.MAC)
		if err != nil {
			return nil, fmt.Errorf("network %q: reservation %s: %w", n.ID, r.MAC, err)
		}
		a.fixed[mac] = r.IP
		a.reserved[mac] = true
	}
	if path == "" {
		return a, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading leases of network %q: %w", n.ID, err)
	}
	var f leaseFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("reading leases of network %q from %s: %w", n.ID, path, err)
	}
	// One lease per MAC and, while unexpired, one MAC per address: a file
	// that says otherwise (edited, or from a bug) keeps the first of each.
	held := map[netip.Addr]bool{}
	now := a.now()
	for _, l := range f.Leases {
		mac, err := normMAC(l.MAC)
		if err != nil || !a.usable(l.IP) {
			continue
		}
		if _, dup := a.leases[mac]; dup || held[l.IP] {
			continue
		}
		l.MAC = mac
		a.leases[mac] = &l
		if l.Expiry.After(now) {
			held[l.IP] = true
		}
	}
	return a, nil
}

func normMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return "", err
	}
	if len(hw) != 6 {
		return "", fmt.Errorf("%s is not a 48-bit MAC address", s)
	}
	return hw.String(), nil
}

// usable reports whether ip may be given to a client at all.
func (a *Allocator) usable(ip netip.Addr) bool {
	return ip.IsValid() && ip.Is4() && a.subnet.Contains(ip) && ip != a.gateway &&
		ip != a.subnet.Addr() && ip != lastAddr(a.subnet)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	for i := 3; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	return netip.AddrFrom4(b)
}

// owner returns the MAC that ip belongs to now other than mac, or "": the
// MAC it is fixed for, or the MAC holding an unexpired lease on it.
func (a *Allocator) owner(ip netip.Addr, mac string, now time.Time) string {
	for m, f := range a.fixed {
		if f == ip && m != mac {
			return m
		}
	}
	for m, l := range a.leases {
		if l.IP == ip && m != mac && now.Before(l.Expiry) {
			return m
		}
	}
	if until, ok := a.declined[ip]; ok && now.Before(until) {
		if _, fixed := a.fixed[mac]; !fixed {
			return "declined"
		}
	}
	return ""
}

// pick chooses the address for mac, preferring requested when it is free.
func (a *Allocator) pick(mac string, requested netip.Addr) (netip.Addr, error) {
	now := a.now()
	if ip, ok := a.fixed[mac]; ok {
		if o := a.owner(ip, mac, now); o != "" && a.fixed[o] == ip {
			return netip.Addr{}, fmt.Errorf("%s is fixed for both %s and %s", ip, mac, o)
		}
		return ip, nil
	}
	inRange := func(ip netip.Addr) bool {
		return a.usable(ip) && !ip.Less(a.start) && !a.end.Less(ip)
	}
	if l, ok := a.leases[mac]; ok && inRange(l.IP) && a.owner(l.IP, mac, now) == "" {
		return l.IP, nil
	}
	if inRange(requested) && a.owner(requested, mac, now) == "" && !a.remembered(requested, mac) {
		return requested, nil
	}
	// A never-used address first, then the one that expired longest ago.
	var oldest netip.Addr
	var oldestExpiry time.Time
	for ip := a.start; ip.IsValid() && !a.end.Less(ip); ip = ip.Next() {
		if !a.usable(ip) || a.owner(ip, mac, now) != "" {
			continue
		}
		m := a.holder(ip)
		if m == "" {
			return ip, nil
		}
		if exp := a.leases[m].Expiry; !oldest.IsValid() || exp.Before(oldestExpiry) {
			oldest, oldestExpiry = ip, exp
		}
	}
	if oldest.IsValid() {
		return oldest, nil
	}
	return netip.Addr{}, ErrNoAddress
}

// holder returns the MAC of any lease, expired or not, on ip.
func (a *Allocator) holder(ip netip.Addr) string {
	for m, l := range a.leases {
		if l.IP == ip {
			return m
		}
	}
	return ""
}

func (a *Allocator) remembered(ip netip.Addr, mac string) bool {
	h := a.holder(ip)
	return h != "" && h != mac
}

// Offer returns the address to offer mac (DHCPDISCOVER); requested is the
// client's wish, honoured when free. It changes nothing.
func (a *Allocator) Offer(mac net.HardwareAddr, requested netip.Addr) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pick(mac.String(), requested)
}

// Commit leases ip to mac (DHCPREQUEST) for the lease time and persists it.
// It fails when ip is not the address mac should have, so the server can NAK.
func (a *Allocator) Commit(mac net.HardwareAddr, ip netip.Addr, hostname string) (backend.Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := mac.String()
	want, err := a.pick(m, ip)
	if err != nil {
		return backend.Lease{}, err
	}
	if want != ip {
		return backend.Lease{}, fmt.Errorf("%s is not available to %s (it would get %s)", ip, m, want)
	}
	// A lease that expired and was remembered for another MAC is taken over.
	if h := a.holder(ip); h != "" && h != m {
		delete(a.leases, h)
	}
	l := &backend.Lease{MAC: m, IP: ip, Hostname: hostname, Expiry: a.now().Add(a.leaseTime).Truncate(time.Second)}
	if hostname == "" {
		if old, ok := a.leases[m]; ok {
			l.Hostname = old.Hostname
		}
	}
	prev, had := a.leases[m]
	a.leases[m] = l
	if err := a.save(); err != nil {
		if had {
			a.leases[m] = prev
		} else {
			delete(a.leases, m)
		}
		return backend.Lease{}, err
	}
	return *l, nil
}

// Decline records that mac found its address in use by someone else
// (DHCPDECLINE): the binding is dropped and the address not offered to
// anyone for a lease time.
func (a *Allocator) Decline(mac net.HardwareAddr, ip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := mac.String()
	l, ok := a.leases[m]
	if !ip.IsValid() && ok {
		ip = l.IP
	}
	if !a.usable(ip) {
		return nil
	}
	a.declined[ip] = a.now().Add(a.leaseTime)
	if ok && l.IP == ip {
		delete(a.leases, m)
		return a.save()
	}
	return nil
}

// Release ends mac's lease now (DHCPRELEASE) but remembers the
// address, so mac gets it back when it asks again and it is still free.
func (a *Allocator) Release(mac net.HardwareAddr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[mac.String()]
	if !ok {
		return nil
	}
	if now := a.now(); l.Expiry.After(now) {
		l.Expiry = now.Truncate(time.Second)
	}
	return a.save()
}

// SetFixed pins mac to ip from now on (a VM file's `ip:`). The address must
// be in the subnet, and neither the gateway nor fixed for another MAC; it may
// lie outside the DHCP range. A client holding a dynamic lease on it is
// refused (NAK) when it renews and gets another address.
func (a *Allocator) SetFixed(mac net.HardwareAddr, ip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := mac.String()
	if !a.usable(ip) {
		return fmt.Errorf("network %q: %s is not a host address of %s other than the gateway %s", a.id, ip, a.subnet, a.gateway)
	}
	for o, f := range a.fixed {
		if f == ip && o != m {
			return fmt.Errorf("network %q: %s is already fixed for %s", a.id, ip, o)
		}
	}
	if a.reserved[m] && a.fixed[m] != ip {
		return fmt.Errorf("network %q: %s has the reservation %s in networks.yaml", a.id, m, a.fixed[m])
	}
	a.fixed[m] = ip
	return nil
}

// ClearFixed undoes SetFixed; reservations of networks.yaml stay.
func (a *Allocator) ClearFixed(mac net.HardwareAddr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m := mac.String(); !a.reserved[m] {
		delete(a.fixed, m)
	}
}

// Lookup returns the current (unexpired) lease of mac.
func (a *Allocator) Lookup(mac net.HardwareAddr) (backend.Lease, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[mac.String()]
	if !ok || !a.now().Before(l.Expiry) {
		return backend.Lease{}, false
	}
	return *l, true
}

// Fixed returns the fixed address of mac, if any.
func (a *Allocator) Fixed(mac net.HardwareAddr) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ip, ok := a.fixed[mac.String()]
	return ip, ok
}

// Leases returns the unexpired leases, by address.
func (a *Allocator) Leases() []backend.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	var out []backend.Lease
	for _, l := range a.leases {
		if now.Before(l.Expiry) {
			out = append(out, *l)
		}
	}
	slices.SortFunc(out, func(x, y backend.Lease) int { return x.IP.Compare(y.IP) })
	return out
}

// save writes every lease, expired ones too, to a.path atomically.
func (a *Allocator) save() error {
	if a.path == "" {
		return nil
	}
	f := leaseFile{Network: a.id, Subnet: a.subnet.String()}
	for _, l := range a.leases {
		f.Leases = append(f.Leases, *l)
	}
	slices.SortFunc(f.Leases, func(x, y backend.Lease) int { return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.MAC, y.MAC)) })
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(a.path, append(data, '\n')); err != nil {
		return fmt.Errorf("saving leases of network %q: %w", a.id, err)
	}
	return nil
}

// writeFileAtomic replaces path with data so that a reader or a crash sees
// the old or the new content, never a mix: a temporary file in the same
// directory, synced, then renamed over path.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
