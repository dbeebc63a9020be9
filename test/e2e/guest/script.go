package guest

import (
	"fmt"
	"strings"
	"time"
)

// Script builds the check script a guest runs at boot (busybox sh, sourced by
// /init after the network drivers are loaded). Every check reports its result
// as a console line "E2E key=value"; after the last step /init reports
// "E2E done" and powers off. Steps that are preconditions (LinkUp, Addr,
// DHCP) abort the script with "E2E fail reason" when they fail; the other
// checks report "fail" as their value and go on.
//
// The methods return the Script so calls can be chained, and the key a
// check reports under is given by the matching *Key function.
type Script struct {
	lines []string
}

// NewScript returns an empty script.
func NewScript() *Script { return &Script{} }

// String returns the shell text.
func (s *Script) String() string { return strings.Join(s.lines, "\n") + "\n" }

// Sh appends raw shell. The e2e_* functions of /e2e/lib.sh are available.
func (s *Script) Sh(format string, args ...any) *Script {
	if len(args) > 0 {
		format = fmt.Sprintf(format, args...)
	}
	s.lines = append(s.lines, format)
	return s
}

func (s *Script) call(fn string, args ...string) *Script {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = Quote(a)
	}
	return s.Sh("%s %s", fn, strings.Join(q, " "))
}

// Report reports key=value where value is the output of the shell command
// cmd (for example `cat /sys/class/net/eth0/mtu`), lines joined by spaces.
func (s *Script) Report(key, cmd string) *Script {
	return s.Sh("e2e_report %s \"$({ %s; } | tr '\\n' ' ')\"", Quote(key), cmd)
}

// Fail aborts the script with a failure reason.
func (s *Script) Fail(reason string) *Script { return s.call("e2e_fail", reason) }

// LinkUp waits (up to 10 s) for the interface to appear, sets it up and
// reports IF.mac.
func (s *Script) LinkUp(ifname string) *Script { return s.call("e2e_link_up", ifname) }

// Addr brings the interface up and adds a static address (CIDR), reporting
// IF.mac and IF.ip.
func (s *Script) Addr(ifname, cidr string) *Script { return s.call("e2e_addr", ifname, cidr) }

// DHCP brings the interface up and runs udhcpc on it (10 discovers, 1 s
// apart). On a lease it configures the address, the default route (first
// router), the MTU (option 26) and /etc/resolv.conf, and reports
// IF.dhcp=ok, IF.ip, IF.prefix, IF.router, IF.dns, IF.domain,
// IF.mtu_option, IF.mtu (the interface's MTU after configuration), IF.lease
// and IF.server. Without a lease it reports IF.dhcp=fail and aborts.
func (s *Script) DHCP(ifname string) *Script { return s.call("e2e_dhcp", ifname) }

// Ping sends 3 pings (2 s timeout each) and reports PingKey(addr) = ok if
// any was answered, else fail.
func (s *Script) Ping(addr string) *Script { return s.call("e2e_ping", addr) }

// Resolve looks name's A records up through the DNS server and reports
// ResolveKey(name) = the addresses, comma separated, or fail.
func (s *Script) Resolve(name, server string) *Script { return s.call("e2e_resolve", name, server) }

// ResolveWithin is Resolve, retried every 0.5 s until the name resolves or
// within passes (for a name that appears when another guest gets its lease).
func (s *Script) ResolveWithin(name, server string, within time.Duration) *Script {
	return s.call("e2e_resolve_within", name, server, seconds(within))
}

// ResolveAAAAWithin is ResolveWithin for name's AAAA records, reported as
// ResolveAAAAKey(name). The server may be an IPv6 address.
func (s *Script) ResolveAAAAWithin(name, server string, within time.Duration) *Script {
	return s.call("e2e_resolve_within", name, server, seconds(within), ResolveAAAAKey(name), "aaaa")
}

// IPv6 enables IPv6 with SLAAC on the interface (disable_ipv6=0,
// forwarding=0, accept_ra=1, autoconf=1), waiting up to 10 s for it to
// appear. Use it before the step that brings the link up (LinkUp, Addr,
// DHCP), so that the router solicitation sent then is answered.
func (s *Script) IPv6(ifname string) *Script { return s.call("e2e_ipv6", ifname) }

// SLAAC waits (polling, up to within) until the interface has an address in
// prefix (e.g. "fd00:1::/64", its length a multiple of 4) that passed
// duplicate address detection, and reports it as IfKey(ifname, "ip6"), and
// the IPv6 default route through the interface (or nothing) as
// IfKey(ifname, "route6"). Without an address it reports "none" and aborts.
func (s *Script) SLAAC(ifname, prefix string, within time.Duration) *Script {
	return s.call("e2e_slaac", ifname, prefix, seconds(within))
}

// Background runs the steps of sub in a background subshell; Wait waits for
// it. A precondition failing there ends the subshell only (its "E2E fail"
// still fails the guest).
func (s *Script) Background(sub *Script) *Script {
	if len(sub.lines) == 0 {
		return s
	}
	s.lines = append(s.lines, "{")
	s.lines = append(s.lines, sub.lines...)
	s.lines = append(s.lines, "} &")
	return s
}

// Wait waits for the steps started in the background.
func (s *Script) Wait() *Script { return s.Sh("wait") }

// PingAs is Ping reporting under key instead of PingKey(addr).
func (s *Script) PingAs(key, addr string) *Script { return s.call("e2e_ping", addr, key) }

// TCPAs is TCP reporting under key instead of TCPKey(addr, port): for a
// second check of the same address, e.g. one that must fail.
func (s *Script) TCPAs(key, addr string, port int) *Script {
	return s.call("e2e_tcp", addr, fmt.Sprint(port), key)
}

// EchoAs is Echo reporting under key instead of EchoKey(addr, port).
func (s *Script) EchoAs(key, addr string, port int, payload string, within time.Duration) *Script {
	return s.call("e2e_echo", addr, fmt.Sprint(port), payload, seconds(within), key)
}

// TCP connects to addr:port and closes; reports TCPKey(addr, port) = ok or
// fail.
func (s *Script) TCP(addr string, port int) *Script {
	return s.call("e2e_tcp", addr, fmt.Sprint(port))
}

// Echo sends payload (one line) to addr:port and expects it back, retrying
// for up to within (the server may still be booting). Reports
// EchoKey(addr, port) = ok or fail (then also EchoKey(...)+".reply").
func (s *Script) Echo(addr string, port int, payload string, within time.Duration) *Script {
	return s.call("e2e_echo", addr, fmt.Sprint(port), payload, seconds(within))
}

// Listen starts a background TCP echo server on port (busybox nc -ll -e)
// and reports ListenKey(port) = up once it listens.
func (s *Script) Listen(port int) *Script { return s.call("e2e_listen", fmt.Sprint(port)) }

// AwaitConns waits up to within until the echo server on port has fully
// served n connections, then reports ListenKey(port)+".conns" (the count)
// and ListenKey(port)+".data" (what was received, lines joined by spaces).
// Use it to keep a server guest running until its clients are done.
func (s *Script) AwaitConns(port, n int, within time.Duration) *Script {
	return s.call("e2e_await_conns", fmt.Sprint(port), fmt.Sprint(n), seconds(within))
}

func seconds(d time.Duration) string {
	sec := int((d + time.Second - 1) / time.Second)
	if sec < 1 {
		sec = 1
	}
	return fmt.Sprint(sec)
}

// Result keys of the checks.
func PingKey(addr string) string           { return "ping." + addr }
func ResolveKey(name string) string        { return "dns." + name }
func ResolveAAAAKey(name string) string    { return "dns6." + name }
func TCPKey(addr string, port int) string  { return fmt.Sprintf("tcp.%s:%d", addr, port) }
func EchoKey(addr string, port int) string { return fmt.Sprintf("echo.%s:%d", addr, port) }
func ListenKey(port int) string            { return fmt.Sprintf("listen.%d", port) }
func IfKey(ifname, what string) string     { return ifname + "." + what }

// Quote quotes s for the shell.
func Quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
