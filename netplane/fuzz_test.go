//go:build linux

package netplane

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vmnetctl/vmnetctl/api"
)

// FuzzDHCPHandle feeds the DHCP handler what a VM could send: it must not
// panic, and an address it hands out must be in the subnet and not the
// gateway.
func FuzzDHCPHandle(f *testing.F) {
	mac := mustMAC("52:55:55:00:00:01")
	for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest,
		dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeDecline, dhcpv4.MessageTypeInform} {
		m, _ := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(mt),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 9, 0, 7))))
		f.Add(m.ToBytes())
	}
	n := testNet("f", api.ModeShared, "10.9.0.0/24")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := dhcpv4.FromBytes(b)
		if err != nil {
			return
		}
		alloc, err := NewAllocator(n, "")
		if err != nil {
			t.Fatal(err)
		}
		h := newDHCPHandler(n, alloc, []netip.Addr{n.Gateway}, log)
		for range 2 {
			r := h.handle(req)
			if r == nil || r.YourIPAddr.IsUnspecified() {
				continue
			}
			ip := addrOf(r.YourIPAddr)
			if !n.Subnet.Contains(ip) || ip == n.Gateway {
				t.Fatalf("handed out %s", ip)
			}
		}
	})
}

// FuzzLeaseFile loads arbitrary lease files: no panic, and every lease kept
// is usable.
func FuzzLeaseFile(f *testing.F) {
	f.Add([]byte(`{"network":"f","leases":[{"mac":"52:55:55:00:00:01","ip":"10.9.0.9","expiry":"2030-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"leases":[{"mac":"zz","ip":"10.9.0.1"},{"mac":"52:55:55:00:00:01","ip":"1.2.3.4"}]}`))
	f.Add([]byte(`not json`))
	n := testNet("f", api.ModeShared, "10.9.0.0/24")
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "f.leases.json")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := NewAllocator(n, path)
		if err != nil {
			return
		}
		for _, l := range a.leases {
			if !a.usable(l.IP) {
				t.Fatalf("kept unusable lease %+v", l)
			}
		}
		lease(t, a, "52:55:55:00:00:02")
	})
}

func FuzzLocalName(f *testing.F) {
	for _, s := range []string{"vm1.vmnet.internal.", "vm1.", ".", "", "a..vmnet.internal", "VMNET.INTERNAL."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		name, _, ok := localName(q)
		if ok && (name == "" || len(name) > len(q)) {
			t.Fatalf("localName(%q) = %q", q, name)
		}
	})
}
