package netplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vmnetctl/vmnetctl/api"
)

// The tests below build small labs of network namespaces: a "host" where
// the code under test runs, "VMs" whose eth0 is the peer of a veth port on
// the network, and a "WAN" or "LAN" behind the host. No packet leaves them.

const (
	busybox = "/usr/bin/busybox"
	wanHost = "198.51.100.1" // the host's uplink address (TEST-NET-2)
	wanPeer = "198.51.100.2" // the WAN namespace: a TCP server and a DNS server
	// labSubnets holds the VM subnets of every lab (10.200.N.0/24). The WAN
	// routes it back to the host, so a VM's packet that the host forwards
	// unmasqueraded is answered: "the VM cannot reach the WAN" then fails
	// only because of the host's rules, never for want of a route back.
	labSubnets = "10.200.0.0/16"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	for _, tool := range []string{busybox, "nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (test/setup.sh installs it)", tool)
		}
	}
}

// newNS returns a fresh network namespace with lo up, removed at cleanup.
func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	in(t, n, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return n
}

// in runs f in namespace n and fails the test on error. f must not call
// t.Fatal: it runs on another goroutine.
func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// run runs a command in namespace n and returns its combined output.
func run(n ns.NetNS, timeout time.Duration, name string, args ...string) (string, error) {
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var err error
		out, err = exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out), err
}

// eventually polls f until it succeeds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, not synchronisation
	}
}

func addAddr(name, cidr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// veth creates the veth hostName in namespace host whose peer, eth0 with the
// given MAC, is in namespace other; both are up.
func veth(t *testing.T, host ns.NetNS, hostName string, other ns.NetNS, mac string) {
	t.Helper()
	in(t, host, func() error {
		la := netlink.NewLinkAttrs()
		la.Name = hostName
		v := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(other.Fd()))}
		if mac != "" {
			v.PeerHardwareAddr = mustMAC(mac)
		}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("veth %s: %w", hostName, err)
		}
		l, err := netlink.LinkByName(hostName)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	in(t, other, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
}

// vm creates a VM namespace whose eth0 (with mac) is attached to bridge as
// port "p-<name>" with AttachPort.
func vm(t *testing.T, host ns.NetNS, name, mac, bridge string, isolated bool) ns.NetNS {
	t.Helper()
	v := newNS(t)
	port := "p-" + name
	veth(t, host, port, v, mac)
	in(t, host, func() error {
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		return AttachPort(bridge, l, isolated)
	})
	return v
}

// wan connects host to a WAN namespace through the uplink "uplink": the host
// is wanHost and routes by default to wanPeer; the WAN routes labSubnets
// back to wanHost.
func wan(t *testing.T, host ns.NetNS) ns.NetNS {
	t.Helper()
	w := newNS(t)
	veth(t, host, "uplink", w, "")
	in(t, host, func() error {
		if err := addAddr("uplink", wanHost+"/24"); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(wanPeer)})
	})
	in(t, w, func() error {
		if err := addAddr("eth0", wanPeer+"/24"); err != nil {
			return err
		}
		_, dst, err := net.ParseCIDR(labSubnets)
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: net.ParseIP(wanHost)})
	})
	return w
}

// chainRules returns the rules of a chain of network id's nftables table as
// the kernel lists them (`nft list chain`), one per line.
func chainRules(t *testing.T, host ns.NetNS, id, chain string) []string {
	t.Helper()
	out, err := run(host, 5*time.Second, "nft", "list", "chain", "inet", TableName(id), chain)
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	inChain := false
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "type "): // the chain's hook and policy: the rules follow
			inChain = true
		case l == "}":
			inChain = false
		case inChain && l != "":
			rules = append(rules, l)
		}
	}
	return rules
}

// wantRules fails the test unless got is want, rule by rule.
func wantRules(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// setForwardRules, with on false, flushes the forward chain of network n's
// table, as if its rules were missing; with on true it ensures n again,
// which puts them back.
func setForwardRules(t *testing.T, host ns.NetNS, n *api.Network, on bool) {
	t.Helper()
	if on {
		in(t, host, func() error { return Ensure(context.Background(), n) })
		return
	}
	if _, err := run(host, 5*time.Second, "nft", "flush", "chain", "inet", TableName(n.ID), "forward"); err != nil {
		t.Fatal(err)
	}
}

const udhcpcScript = `#!/bin/sh
bb=` + busybox + `
case "$1" in
bound|renew)
	$bb ip addr flush dev "$interface"
	$bb ip addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && $bb ip link set dev "$interface" mtu "$mtu"
	[ -n "$router" ] && $bb ip route replace default via "$router" dev "$interface"
	{ echo "ip=$ip"; echo "mask=$mask"; echo "router=$router"; echo "dns=$dns"; echo "mtu=$mtu"; echo "lease=$lease"; echo "serverid=$serverid"; } > "$0.out"
	;;
esac
exit 0
`

// udhcpc runs busybox udhcpc in namespace v until it has a lease and returns
// what the lease said (ip, mask, router, dns, mtu, lease, serverid).
func udhcpc(t *testing.T, v ns.NetNS, hostname string) (map[string]string, error) {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"udhcpc", "-i", "eth0", "-s", script, "-q", "-f", "-n", "-t", "10", "-T", "1", "-A", "1", "-O", "mtu"}
	if hostname != "" {
		args = append(args, "-x", "hostname:"+hostname)
	}
	if out, err := run(v, 30*time.Second, busybox, args...); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	f, err := os.Open(script + ".out")
	if err != nil {
		return nil, fmt.Errorf("udhcpc wrote no lease: %w", err)
	}
	defer f.Close()
	lease := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		lease[k] = v
	}
	return lease, nil
}

func mustUdhcpc(t *testing.T, v ns.NetNS, hostname string) map[string]string {
	t.Helper()
	l, err := udhcpc(t, v, hostname)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ping(v ns.NetNS, addr string) error {
	_, err := run(v, 10*time.Second, busybox, "ping", "-c", "1", "-W", "1", addr)
	return err
}

// tcpServer listens on wanPeer in namespace w and reports the source
// address of each connection.
func tcpServer(t *testing.T, w ns.NetNS) (string, <-chan netip.Addr) {
	t.Helper()
	var ln net.Listener
	in(t, w, func() error {
		var err error
		ln, err = net.Listen("tcp4", wanPeer+":0")
		return err
	})
	t.Cleanup(func() { ln.Close() })
	seen := make(chan netip.Addr, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			c.Close()
		}
	}()
	return ln.Addr().String(), seen
}

func dial(v ns.NetNS, addr string, timeout time.Duration) error {
	return v.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// timerRe matches what changes on its own: a bridge's running timers and
// the tentative state of IPv6 link-local addresses during DAD.
var timerRe = regexp.MustCompile(`\b\w+_timer\s+\S+| tentative\b`)

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out strings.Builder
	for l, c := range count {
		for ; c > 0; c-- {
			fmt.Fprintf(&out, "- %s\n", l)
		}
		for ; c < 0; c++ {
			fmt.Fprintf(&out, "+ %s\n", l)
		}
	}
	return out.String()
}

// snapshot is what a test compares before and after: links (with details,
// less the bridge's running timers), addresses, routes and the nft ruleset.
func snapshot(t *testing.T, host ns.NetNS) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"ip", "-d", "link"}, {"ip", "addr"}, {"ip", "route"}, {"nft", "list", "ruleset"}} {
		out, err := run(host, 10*time.Second, args[0], args[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "$ %s\n%s\n", strings.Join(args, " "), timerRe.ReplaceAllString(out, ""))
	}
	return b.String()
}
