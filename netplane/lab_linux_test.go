package netplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The tests below build small labs of network namespaces: a "host" where
// the code under test runs, "VMs" whose eth0 is the peer of a veth port on
// the network, and a "WAN" or "LAN" behind the host. No packet leaves them.

const (
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
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "busybox", "nft", "ip", "ping")
}

// sendUDP sends payload times over UDP from namespace n to the address
// to ("host:port"), from the local address from if it is not "".
func sendUDP(t *testing.T, n *testutil.NS, from, to string, payload []byte, times int) {
	t.Helper()
	n.MustDo(t, func() error {
		var laddr *net.UDPAddr
		if from != "" {
			laddr = &net.UDPAddr{IP: net.ParseIP(from)}
		}
		raddr, err := net.ResolveUDPAddr("udp4", to)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp4", laddr, raddr)
		if err != nil {
			return err
		}
		defer c.Close()
		for range times {
			c.Write(payload)
		}
		return nil
	})
}

// veth creates the veth hostName in namespace host whose peer, eth0 with the
// given MAC, is in namespace other; both are up.
func veth(t *testing.T, host *testutil.NS, hostName string, other *testutil.NS, mac string) {
	t.Helper()
	peer := []string{"name", "eth0"}
	if mac != "" {
		peer = append(peer, "address", mac)
	}
	args := append([]string{"-n", host.Name, "link", "add", hostName, "up", "type", "veth", "peer"}, peer...)
	testutil.Run(t, "ip", append(args, "netns", other.Name)...)
	other.MustRun(t, "ip", "link", "set", "eth0", "up")
}

// vm creates a VM namespace whose eth0 (with mac) is attached to bridge as
// port "p-<name>" with AttachPort.
func vm(t *testing.T, host *testutil.NS, name, mac, bridge string, isolated bool) *testutil.NS {
	t.Helper()
	v := testutil.NewNS(t, "vm-"+name)
	port := "p-" + name
	veth(t, host, port, v, mac)
	host.MustDo(t, func() error {
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
func wan(t *testing.T, host *testutil.NS) *testutil.NS {
	t.Helper()
	w := testutil.NewNS(t, "wan")
	veth(t, host, "uplink", w, "")
	host.MustRun(t, "ip", "addr", "add", wanHost+"/24", "dev", "uplink")
	host.MustRun(t, "ip", "route", "add", "default", "via", wanPeer)
	w.MustRun(t, "ip", "addr", "add", wanPeer+"/24", "dev", "eth0")
	w.MustRun(t, "ip", "route", "add", labSubnets, "via", wanHost)
	return w
}

// chainRules returns the rules of a chain of network id's nftables table as
// the kernel lists them (`nft list chain`), one per line.
func chainRules(t *testing.T, host *testutil.NS, id, chain string) []string {
	t.Helper()
	out := host.MustRun(t, "nft", "list", "chain", "inet", hostnet.TableName(id), chain)
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
func setForwardRules(t *testing.T, host *testutil.NS, n *api.Network, on bool) {
	t.Helper()
	if on {
		host.MustDo(t, func() error { return Ensure(context.Background(), n) })
		return
	}
	host.MustRun(t, "nft", "flush", "chain", "inet", hostnet.TableName(n.ID), "forward")
}

// mustUdhcpc gets a lease on eth0 of namespace v (sending hostname, if
// any) and returns what the lease said (ip, mask, router, dns, mtu, lease,
// serverid).
func mustUdhcpc(t *testing.T, v *testutil.NS, hostname string) map[string]string {
	t.Helper()
	var extra []string
	if hostname != "" {
		extra = []string{"-x", "hostname:" + hostname}
	}
	l, err := v.DHCP(t, "eth0", extra...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// tcpServer listens on wanPeer in namespace w and reports the source
// address of each connection.
func tcpServer(t *testing.T, w *testutil.NS) (string, <-chan netip.Addr) {
	t.Helper()
	ln := w.Listen(t, "tcp4", wanPeer+":0")
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

func dial(v *testutil.NS, addr string, timeout time.Duration) error {
	return v.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// timerRe matches what changes on its own: a bridge's running timers and
// the tentative state of IPv6 link-local addresses during DAD.
// timedElemsRe matches the elements of sets that the kernel fills and
// empties on its own (with timeouts: the next hops of the neighbour bound).
var timedElemsRe = regexp.MustCompile(`(?m)^\s*elements = \{[^}]*expires[^}]*\}\n`)

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

// peerNetnsRe is a line ip prints while a peer's namespace goes away.
var peerNetnsRe = regexp.MustCompile(`(?m)^Error: Peer netns reference is invalid\.\n?`)

// snapshot is what a test compares before and after: links (with details,
// less the bridge's running timers), addresses, routes and the nft ruleset.
func snapshot(t *testing.T, host *testutil.NS) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"ip", "-d", "link"}, {"ip", "addr"}, {"ip", "route"},
		// By family: Ensure replaces the inet table, which moves it after the others.
		{"nft", "list", "ruleset", "inet"}, {"nft", "list", "ruleset", "bridge"}, {"nft", "list", "ruleset", "ip"}} {
		out := host.MustRun(t, args[0], args[1:]...)
		out = timedElemsRe.ReplaceAllString(timerRe.ReplaceAllString(out, ""), "")
		// ip's complaint about a link whose peer's namespace another
		// test is deleting at that moment: the host's state is the same.
		out = peerNetnsRe.ReplaceAllString(out, "")
		fmt.Fprintf(&b, "$ %s\n%s\n", strings.Join(args, " "), out)
	}
	return b.String()
}

// guardNow is the injected clock of the DHCP guard tests.
var guardNow = time.Unix(1_800_000_000, 0)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

var mustMAC = testutil.MAC

// allNodes is the IPv6 all-nodes group, where router advertisements and
// unsolicited advertisements go.
var allNodes = netip.MustParseAddr("ff02::1")

// The frames a guest writes, and its raw socket (testutil's).
var (
	nd6Frame       = testutil.ND6Frame
	nd6LLA         = testutil.ND6LLA
	solicitedNode  = testutil.SolicitedNode
	dadNS          = testutil.DADNS
	nd6AllNodesMAC = testutil.AllNodesMAC
	newRawSender   = testutil.NewRawSender
)
