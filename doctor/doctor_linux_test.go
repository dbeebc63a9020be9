package doctor

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"golang.org/x/sys/unix"
)

func find(r *Report, check string) (Finding, bool) {
	for _, f := range r.Findings {
		if f.Check == check {
			return f, true
		}
	}
	return Finding{}, false
}

// A host where every common trouble is set up in a namespace of the
// test's own: something on the DHCP port of all addresses, an address in
// a network's subnet, and Docker's FORWARD policy DROP. Each is found,
// named, and given a fix; a clean namespace has no problem.
func TestDoctorFindsTrouble(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip", "nft")
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  shared:\n    subnet: 10.93.0.0/24\n  host:\n    mode: host\n    subnet: 10.94.0.0/24\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	ns := testutil.NewNS(t, "doc")
	var clean *Report
	if err := ns.Do(func() error { clean = Run(context.Background(), nets.Networks); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"ports 53, 67", "subnet of shared", "subnet of host", "FORWARD policy"} {
		if f, ok := find(clean, c); !ok || f.Status != OK {
			t.Errorf("clean namespace: %s: %+v", c, f)
		}
	}
	if f, _ := find(clean, "IPv6"); f.Status != Info || !strings.Contains(f.Detail, "turns it on for NAT66 (shared)") {
		t.Errorf("clean namespace: IPv6: %+v, want that up turns forwarding on for shared", f)
	}

	ns.MustRun(t, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1")
	ns.MustRun(t, "ip", "addr", "add", "10.94.0.77/16", "dev", "lan0")
	ns.MustRun(t, "ip", "link", "set", "lan0", "up")
	ns.MustRun(t, "ip", "route", "add", "10.93.0.0/25", "dev", "lan0")
	ns.MustRun(t, "nft", "add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }")
	ns.MustRun(t, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
	// A DNS server on the shared network's gateway address (not assigned
	// here: IP_FREEBIND), as libvirt's dnsmasq would be on its own.
	var dns net.PacketConn
	if err := ns.Do(func() (err error) {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1) })
		}}
		dns, err = lc.ListenPacket(context.Background(), "udp4", "10.93.0.1:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer dns.Close()
	var dhcp net.PacketConn
	if err := ns.Do(func() (err error) { dhcp, err = net.ListenPacket("udp4", "0.0.0.0:67"); return err }); err != nil {
		t.Fatal(err)
	}
	defer dhcp.Close()
	var r *Report
	if err := ns.Do(func() error { r = Run(context.Background(), nets.Networks); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		check  string
		status Status
		says   string
	}{
		{"port 67", Fail, "0.0.0.0 port 67"},
		{"port 53", Fail, "10.93.0.1 port 53 (the gateway of network shared)"},
		{"subnet of shared", Fail, "route"},
		{"subnet of host", Fail, "10.94.0.77/16"},
		{"FORWARD policy", Warn, "DROP"},
		{"IPv6", Warn, "IPv6 is off on this host"},
	} {
		f, ok := find(r, want.check)
		if !ok || f.Status != want.status || !strings.Contains(f.Detail, want.says) || f.Fix == "" {
			t.Errorf("%s: %+v, want %s saying %q with a fix", want.check, f, want.status, want.says)
		}
	}
	if f, _ := find(r, "port 67"); !strings.Contains(f.Detail, "(pid ") {
		t.Errorf("port 67: the finding does not name the process: %s", f.Detail)
	}
	if r.Problems < 5 {
		t.Errorf("%d problems, want at least 5", r.Problems)
	}
	var out strings.Builder
	r.Render(&out)
	if !strings.Contains(out.String(), "problems found.") || !strings.Contains(out.String(), "iptables -I FORWARD -o vmn-+ -j ACCEPT") {
		t.Errorf("rendered report:\n%s", out.String())
	}
}

func TestProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F":                         "127.0.0.1",
		"00000000":                         "0.0.0.0",
		"0100A8C0":                         "192.168.0.1",
		"00000000000000000000000000000000": "::",
		"0000000000000000FFFF00000100007F": "127.0.0.1",
	} {
		if got := procAddr(in); got != netip.MustParseAddr(want) {
			t.Errorf("procAddr(%s) = %s, want %s", in, got, want)
		}
	}
}
