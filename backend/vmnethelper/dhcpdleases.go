package vmnethelper

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// DHCPDLeasesPath is where macOS's DHCP server (bootpd, which vmnet starts
// for shared and host networks) keeps its leases.
const DHCPDLeasesPath = "/var/db/dhcpd_leases"

// DHCPDLease is one block of /var/db/dhcpd_leases:
//
//	{
//		name=vm1
//		ip_address=192.168.105.2
//		hw_address=1,52:55:55:1:2:3
//		identifier=1,52:55:55:1:2:3
//		lease=0x67f0a1b2
//	}
//
// bootpd writes octets without leading zeros. hw_address and identifier
// are TYPE,BYTES with TYPE in hex: 1 is an Ethernet address; ff is an RFC
// 4361 client identifier (a 4-byte IAID, then a DHCPv6 DUID), which bootpd
// also writes as hw_address when the client sends one (systemd-networkd,
// recent Ubuntu and Debian do), so the VM's MAC is then only found inside
// the DUID, if at all.
type DHCPDLease struct {
	// Name is the host name the client sent (name=), often empty.
	Name string
	// IP is the leased address (ip_address=).
	IP netip.Addr
	// HWAddress and Identifier are the raw values of hw_address= and
	// identifier=.
	HWAddress  string
	Identifier string
	// MAC is the client's Ethernet address: hw_address's (or identifier's)
	// when its type is 1, else the link-layer address of a DUID-LLT
	// (type 1) or DUID-LL (type 3) of Ethernet inside an ff client id;
	// nil when there is none (a DUID-EN or DUID-UUID carries no MAC). A
	// DUID's address is that of some interface of the client when it made
	// the DUID, usually but not surely this one.
	MAC net.HardwareAddr
	// Expires is when the lease ends (lease=, seconds since the epoch in
	// hex); zero if absent.
	Expires time.Time
	// Line is the line of the block's "{", for messages.
	Line int
}

// ParseDHCPDLeases parses macOS's /var/db/dhcpd_leases. It returns every
// well-formed lease in file order and, if some blocks are not well formed
// (no or bad ip_address, a bad hw_address or lease, a line outside a
// block, an unclosed block), an error naming their lines: the others are
// still returned. An unclosed last block is what a file caught mid-write
// looks like; it is skipped too. Unknown keys are ignored.
func ParseDHCPDLeases(data []byte) ([]DHCPDLease, error) {
	var (
		leases []DHCPDLease
		errs   []error
		cur    *DHCPDLease
		bad    error // of the current block
		lineNo int
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case line == "{":
			if cur != nil {
				errs = append(errs, fmt.Errorf("line %d: block not closed before line %d", cur.Line, lineNo))
			}
			cur, bad = &DHCPDLease{Line: lineNo}, nil
			continue
		case line == "}":
			if cur == nil {
				errs = append(errs, fmt.Errorf("line %d: } outside a block", lineNo))
				continue
			}
			if bad == nil && !cur.IP.IsValid() {
				bad = fmt.Errorf("line %d: lease without ip_address", cur.Line)
			}
			if bad != nil {
				errs = append(errs, bad)
			} else {
				if cur.MAC == nil {
					cur.MAC = clientMAC(cur.Identifier)
				}
				leases = append(leases, *cur)
			}
			cur = nil
			continue
		}
		if cur == nil {
			errs = append(errs, fmt.Errorf("line %d: %q outside a block", lineNo, line))
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			if bad == nil {
				bad = fmt.Errorf("line %d: %q is not key=value", lineNo, line)
			}
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		var err error
		switch key {
		case "name":
			cur.Name = val
		case "ip_address":
			a, perr := netip.ParseAddr(val)
			if perr != nil || !a.Is4() {
				err = fmt.Errorf("line %d: ip_address %q is not an IPv4 address", lineNo, val)
			}
			cur.IP = a
		case "hw_address":
			cur.HWAddress = val
			if _, _, perr := parseHWAddress(val); perr != nil {
				err = fmt.Errorf("line %d: hw_address %q: %v", lineNo, val, perr)
			}
			cur.MAC = clientMAC(val)
		case "identifier":
			cur.Identifier = val
		case "lease":
			secs, perr := strconv.ParseUint(val, 0, 63)
			if perr != nil {
				err = fmt.Errorf("line %d: lease %q is not a number of seconds", lineNo, val)
				break
			}
			cur.Expires = time.Unix(int64(secs), 0).UTC()
		}
		if err != nil && bad == nil {
			bad = err
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("line %d: %w", lineNo+1, err))
	}
	// An unclosed last block is a write in progress: skip it silently.
	if err := errors.Join(errs...); err != nil {
		return leases, fmt.Errorf("%s: %w", DHCPDLeasesPath, err)
	}
	return leases, nil
}

// parseHWAddress splits TYPE,BYTES, where TYPE is hex and BYTES are
// colon-separated hex octets of one or two digits.
func parseHWAddress(s string) (typ byte, b []byte, err error) {
	ts, bs, ok := strings.Cut(s, ",")
	if !ok {
		return 0, nil, errors.New("want TYPE,ADDRESS")
	}
	t, err := strconv.ParseUint(ts, 16, 8)
	if err != nil {
		return 0, nil, fmt.Errorf("type %q is not a hex byte", ts)
	}
	b, err = parseOctets(bs)
	if err != nil {
		return 0, nil, err
	}
	if len(b) == 0 {
		return 0, nil, errors.New("no address")
	}
	return byte(t), b, nil
}

func parseOctets(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ":")
	b := make([]byte, len(parts))
	for i, p := range parts {
		if len(p) == 0 || len(p) > 2 {
			return nil, fmt.Errorf("octet %q is not one or two hex digits", p)
		}
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return nil, fmt.Errorf("octet %q is not hex", p)
		}
		b[i] = byte(v)
	}
	return b, nil
}

// DUID types (RFC 8415) that embed a link-layer address, and Ethernet's
// hardware type.
const (
	duidLLT      = 1
	duidLL       = 3
	hwEthernet   = 1
	iaidLen      = 4
	clientIDDUID = 0xff // RFC 4361: IAID + DUID
)

// clientMAC is the Ethernet address in a hw_address or identifier value,
// or nil.
func clientMAC(v string) net.HardwareAddr {
	typ, b, err := parseHWAddress(v)
	if err != nil {
		return nil
	}
	switch typ {
	case hwEthernet:
		if len(b) == 6 {
			return net.HardwareAddr(b)
		}
	case clientIDDUID:
		if len(b) < iaidLen+2 {
			return nil
		}
		duid := b[iaidLen:]
		var ll []byte
		switch uint16(duid[0])<<8 | uint16(duid[1]) {
		case duidLLT: // type, hardware type, time, address
			if len(duid) < 8 || uint16(duid[2])<<8|uint16(duid[3]) != hwEthernet {
				return nil
			}
			ll = duid[8:]
		case duidLL: // type, hardware type, address
			if len(duid) < 4 || uint16(duid[2])<<8|uint16(duid[3]) != hwEthernet {
				return nil
			}
			ll = duid[4:]
		}
		if len(ll) == 6 {
			return net.HardwareAddr(ll)
		}
	}
	return nil
}

// ParseLooseMAC parses a MAC address written with or without leading zeros
// in its octets ("52:55:55:1:2:3", as bootpd and macOS's arp write them,
// or "52-55-55-01-02-03"). Only 48-bit addresses are accepted.
func ParseLooseMAC(s string) (net.HardwareAddr, error) {
	b, err := parseOctets(strings.ReplaceAll(strings.TrimSpace(s), "-", ":"))
	if err != nil || len(b) != 6 {
		if err == nil {
			err = errors.New("not 6 octets")
		}
		return nil, fmt.Errorf("%q is not a MAC address: %v", s, err)
	}
	return net.HardwareAddr(b), nil
}

// LookupLease finds the lease of mac (any spelling ParseLooseMAC takes):
// the leases whose MAC is mac (see DHCPDLease.MAC: from hw_address, or from
// a DUID-LLT or DUID-LL client identifier), and of those the one that
// expires last, since bootpd keeps stale leases of a MAC; on a tie the first
// in the file (bootpd writes the newest first).
func LookupLease(leases []DHCPDLease, mac string) (DHCPDLease, bool) {
	want, err := ParseLooseMAC(mac)
	if err != nil {
		return DHCPDLease{}, false
	}
	best, found := DHCPDLease{}, false
	for _, l := range leases {
		if !bytes.Equal(l.MAC, want) {
			continue
		}
		if !found || l.Expires.After(best.Expires) {
			best, found = l, true
		}
	}
	return best, found
}

// String is the lease as one line, for logs.
func (l DHCPDLease) String() string {
	mac := "-"
	if l.MAC != nil {
		mac = l.MAC.String()
	}
	name := l.Name
	if name == "" {
		name = "-"
	}
	exp := "-"
	if !l.Expires.IsZero() {
		exp = l.Expires.Format(time.RFC3339)
	}
	return fmt.Sprintf("%s %s %s %s", l.IP, mac, name, exp)
}

// CurrentLeases are the leases a network's status shows: those in subnet
// (all if subnet is the zero Prefix), not expired at now (none are if now
// is zero), and one per MAC — the one that expires last, as LookupLease
// picks. Leases without a MAC (a DUID-EN client id) are kept, one per IP
// address. The order is the file's.
func CurrentLeases(leases []DHCPDLease, subnet netip.Prefix, now time.Time) []DHCPDLease {
	keep := func(l DHCPDLease) bool {
		return (!subnet.IsValid() || subnet.Contains(l.IP)) &&
			(now.IsZero() || l.Expires.IsZero() || l.Expires.After(now))
	}
	best := map[string]int{} // MAC or "ip:"+IP → index into leases
	for i, l := range leases {
		if !keep(l) {
			continue
		}
		key := "ip:" + l.IP.String()
		if l.MAC != nil {
			key = l.MAC.String()
		}
		if j, ok := best[key]; !ok || l.Expires.After(leases[j].Expires) {
			best[key] = i
		}
	}
	var out []DHCPDLease
	for i, l := range leases {
		key := "ip:" + l.IP.String()
		if l.MAC != nil {
			key = l.MAC.String()
		}
		if j, ok := best[key]; ok && j == i {
			out = append(out, l)
		}
	}
	return out
}
