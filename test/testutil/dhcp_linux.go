package testutil

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// udhcpcScript is busybox udhcpc's event script: it applies the lease
// (address, MTU, default route) and writes its options to "$0.out".
const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip -4 addr flush dev "$interface"
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && ip link set dev "$interface" mtu "$mtu"
	for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
	{ echo "ip=$ip"; echo "mask=$mask"; echo "router=$router"; echo "dns=$dns"; echo "mtu=$mtu"; echo "lease=$lease"; echo "serverid=$serverid"; } > "$0.out"
	;;
esac
exit 0
`

// DHCP runs busybox udhcpc on iface inside the namespace until it has a
// lease (10 tries), applies it and returns what the lease said: ip, mask,
// router, dns, mtu, lease and serverid. extra are more udhcpc arguments,
// such as "-x", "hostname:NAME".
func (n *NS) DHCP(tb testing.TB, iface string, extra ...string) (map[string]string, error) {
	tb.Helper()
	script := filepath.Join(tb.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"udhcpc", "-i", iface, "-s", script, "-q", "-f", "-n", "-t", "10", "-T", "1", "-A", "1", "-O", "mtu"}, extra...)
	if _, err := n.Run(ctx, "busybox", args...); err != nil {
		return nil, fmt.Errorf("DHCP on %s: %w", iface, err)
	}
	f, err := os.Open(script + ".out")
	if err != nil {
		return nil, fmt.Errorf("udhcpc in %s wrote no lease: %w", n, err)
	}
	defer f.Close()
	lease := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		lease[k] = v
	}
	return lease, sc.Err()
}

// DHCPServer makes iface in the namespace the address router (a prefix,
// such as 10.77.0.1/24), brings it up and runs busybox udhcpd on it until
// the test ends: it leases first to last, with router as the default route
// and DNS server.
func (n *NS) DHCPServer(tb testing.TB, iface, router, first, last string) {
	tb.Helper()
	p, err := netip.ParsePrefix(router)
	if err != nil {
		tb.Fatal(err)
	}
	n.MustRun(tb, "ip", "addr", "add", router, "dev", iface)
	n.MustRun(tb, "ip", "link", "set", iface, "up")
	dir := tb.TempDir()
	mask := net.IP(net.CIDRMask(p.Bits(), p.Addr().BitLen()))
	conf := fmt.Sprintf("interface %s\nstart %s\nend %s\noption subnet %s\noption router %s\noption dns %[5]s\nlease_file %[6]s/leases\npidfile %[6]s/pid\n",
		iface, first, last, mask, p.Addr(), dir)
	if err := os.WriteFile(dir+"/udhcpd.conf", []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dir+"/leases", nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	n.Start(tb, dir+"/udhcpd.log", "busybox", "udhcpd", "-f", dir+"/udhcpd.conf")
}
