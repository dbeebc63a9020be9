package controller_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/hostnet"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestDriftRepaired changes a running network behind the controller's back,
// one thing at a time, and waits for the controller to put it back: the
// VM reaches the gateway again and renews its lease, and status counts the
// repair.
func TestDriftRepaired(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1s")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	att := h.Attachment(st, "a")
	vm := h.VM(att)
	ip := vm.DHCP(t)["ip"]
	if err := vm.Ping(gateway, 1); err != nil {
		t.Fatalf("before any drift: %v", err)
	}
	br, table, tap := st.Networks[0].Bridge, hostnet.TableName("shared"), att.Tap
	repairs := func() uint64 { return h.network("shared").Repairs }

	for _, d := range []struct {
		name string
		cmd  []string
		// network: the network itself drifted (and is repaired as a
		// whole); otherwise only the VM's port did.
		network bool
	}{
		{"bridge deleted", []string{"ip", "link", "del", br}, true},
		{"gateway address removed", []string{"ip", "addr", "flush", "dev", br}, true},
		{"nftables table deleted", []string{"nft", "delete", "table", "inet", table}, true},
		// Not counted as the network's own repair every time: the pass
		// that repairs the ports may put the guard table back first (the
		// checks below still require the port guarded again).
		{"guard table deleted", []string{"nft", "delete", "table", "bridge", table}, false},
		{"TAP taken off the bridge", []string{"ip", "link", "set", tap, "nomaster"}, false},
		{"TAP deleted", []string{"ip", "link", "del", tap}, false},
	} {
		before := repairs()
		h.MustRun(t, d.cmd[0], d.cmd[1:]...)
		testutil.Eventually(t, 30*time.Second, func() error {
			if d.network && repairs() <= before {
				return fmt.Errorf("no repair counted yet")
			}
			for _, n := range h.Status().Networks {
				if n.State != "up" {
					return fmt.Errorf("network %s is %s: %s", n.Name, n.State, n.Error)
				}
			}
			if out, _ := h.Run(context.Background(), "ip", "link", "show", "master", br); !strings.Contains(out, tap+":") {
				return fmt.Errorf("%s is not a port of %s", tap, br)
			}
			if out, _ := h.Run(context.Background(), "nft", "list", "set", "bridge", table, "guarded"); !strings.Contains(out, `"`+tap+`"`) {
				return fmt.Errorf("%s is not guarded: %s", tap, out)
			}
			return vm.Ping(gateway, 1)
		}, "repair after: %s", d.name)
		if got := vm.DHCP(t)["ip"]; got != ip {
			t.Errorf("after %s: the VM's lease is %s, was %s", d.name, got, ip)
		}
	}
	if out := h.MustVmnetctl("events"); strings.Count(out, "drift-found") < 3 || strings.Count(out, "drift-repaired") < 3 {
		t.Errorf("events after three network drifts:\n%s", out)
	}
}

// TestSettledPortsRepaired: once nothing changes, a full pass leaves the
// VMs' ports unread (vmnetctl_full_reconciles_total{ports="settled"}),
// with an impaired VM and one of a fixed address on the network (what a
// full pass writes again of the guards writes nothing while it is as
// written: else every pass would be a notice for the next). A port's
// guard deleted behind the controller's back, which starts no pass of
// its own (an element of a set, not a table), is a notice the watch
// counts: the next full pass reads the ports again and guards the port
// again; then they settle again. The full passes here are reloads
// (SIGHUP), one at a time, the resync an hour away.
func TestSettledPortsRepaired(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1h")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n        impair: {loss: 1%}\n  b:\n    networks:\n      - vmnet: shared\n        ip: 10.77.0.10\n")
	h.MustVmnetctl("up", "-f", vms)
	tap := h.Attachment(h.Status(), "a").Tap
	table := hostnet.TableName("shared")
	pid := h.controllerPID()
	series := func(name, labels string) float64 {
		t.Helper()
		v, err := h.series(name, labels)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	passes := func(ports string) float64 { return series("vmnetctl_full_reconciles_total", `ports="`+ports+`"`) }
	ended := func() float64 {
		return series("vmnetctl_reconciles_total", `result="success"`) + series("vmnetctl_reconciles_total", `result="error"`)
	}
	fullPasses := func() float64 { return passes("read") + passes("settled") }
	// full has the controller make a full pass, and waits for it to
	// begin and for a pass to end after; it tells whether the full pass
	// left the ports unread. (Nothing else asks for a pass here.)
	full := func() (settled bool) {
		t.Helper()
		before, fullBefore, settledBefore := ended(), fullPasses(), passes("settled")
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Minute, func() bool { return fullPasses() > fullBefore && ended() > before }, "no full pass after a reload")
		return passes("settled") > settledBefore
	}
	// The first full passes read the ports (the up's writes are notices);
	// within a few, one leaves them unread.
	settledAfter := func(what string) {
		t.Helper()
		for range 4 {
			if full() {
				return
			}
		}
		t.Fatalf("four full passes %s, none left the ports unread", what)
	}
	settledAfter("after the up")
	if !full() {
		t.Fatal("the next full pass, nothing changed, read the ports")
	}
	read, notices := passes("read"), series("vmnetctl_port_notices_total", "")
	h.MustRun(t, "nft", "delete", "element", "bridge", table, "guarded", "{ \""+tap+"\" }")
	// (The watch reads the notice a moment after the deletion; a pass
	// that began before that is the next one's to count.)
	testutil.Eventually(t, time.Minute, func() bool { return series("vmnetctl_port_notices_total", "") > notices }, "the guard's element deleted: no notice counted")
	if full() {
		t.Fatal("the full pass after a port's guard was deleted left the ports unread")
	}
	testutil.Eventually(t, time.Minute, func() error {
		if out, _ := h.Run(context.Background(), "nft", "list", "set", "bridge", table, "guarded"); !strings.Contains(out, `"`+tap+`"`) {
			return fmt.Errorf("%s is not guarded again: %s", tap, out)
		}
		return nil
	}, "the port's guard put back")
	if passes("read") <= read {
		t.Error("no full pass read the ports")
	}
	settledAfter("after the repair")
}

// TestDriftEvents repairs drift as it happens, not at the resync (an hour
// here): a bridge's address flushed and the network's nftables tables
// deleted are seen on netlink and put back within seconds. And a repair
// that cannot succeed (the bridge deleted and its name taken by a veth)
// leaves the network degraded, with the reason, in status and the metrics,
// until the name is free again: then it is repaired, up, and the repair is
// counted.
func TestDriftEvents(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1h")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	br, table := st.Networks[0].Bridge, hostnet.TableName("shared")
	network := func() ctlapi.NetworkStatus { return h.network("shared") }
	series := h.series
	metric := func(name string) (float64, error) { return series(name, `network="shared"`) }

	// Repaired on events, long before the resync. (The guard table may be
	// put back by the VM port's repair, in a pass that was under way: the
	// checks are on the kernel, not on the repair count.)
	tap := h.Attachment(st, "a").Tap
	gw := gateway + "/24"
	for _, d := range []struct {
		name     string
		cmd      []string
		repaired []string // a command whose output shows the repair
		want     string
	}{
		{"gateway address removed", []string{"ip", "addr", "flush", "dev", br}, []string{"ip", "addr", "show", "dev", br}, gw},
		{"nftables table deleted", []string{"nft", "delete", "table", "inet", table}, []string{"nft", "list", "table", "inet", table}, "chain"},
		{"guard table deleted", []string{"nft", "delete", "table", "bridge", table}, []string{"nft", "list", "set", "bridge", table, "guarded"}, `"` + tap + `"`},
	} {
		h.MustRun(t, d.cmd[0], d.cmd[1:]...)
		testutil.Eventually(t, 15*time.Second, func() error {
			if out, _ := h.Run(context.Background(), d.repaired[0], d.repaired[1:]...); !strings.Contains(out, d.want) {
				return fmt.Errorf("%s shows no %s:\n%s", strings.Join(d.repaired, " "), d.want, out)
			}
			if n := network(); n.State != "up" {
				return fmt.Errorf("network is %s (%s)", n.State, n.Error)
			}
			return nil
		}, "repair after: %s", d.name)
	}

	// A repair that fails. The bridge is deleted and a veth takes its
	// name; the controller may recreate the bridge in between (it repairs
	// on the deletion, and counts that repair), so try until the veth won.
	testutil.Eventually(t, 15*time.Second, func() error {
		_, err := h.Run(context.Background(), "sh", "-c", "ip link del "+br+"; ip link add "+br+" type veth peer name sq-"+br)
		return err
	}, "squatting %s", br)
	testutil.Eventually(t, 15*time.Second, func() error {
		n := network()
		if n.State != "degraded" || !strings.Contains(n.Error, br) {
			return fmt.Errorf("network is %s: %s", n.State, n.Error)
		}
		if v, err := metric("vmnetctl_network_degraded"); err != nil || v != 1 {
			return fmt.Errorf("vmnetctl_network_degraded is %v (%v)", v, err)
		}
		return nil
	}, "degraded while %s is a veth", br)
	t.Logf("degraded: %s", network().Error)
	// It stays so while the repair keeps failing (retried with backoff):
	// once another try failed, still degraded, and no repair counted.
	before := network().Repairs
	failed, err := series("vmnetctl_reconciles_total", `result="error"`)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if v, err := series("vmnetctl_reconciles_total", `result="error"`); err != nil || v <= failed {
			return fmt.Errorf("%v failed reconciles (%v), %v before", v, err, failed)
		}
		return nil
	}, "the repair tried again while %s is a veth", br)
	if n := network(); n.State != "degraded" || n.Repairs != before {
		t.Errorf("with the veth still there: %s, %d repairs (was %d)", n.State, n.Repairs, before)
	}

	h.MustRun(t, "ip", "link", "del", br)
	testutil.Eventually(t, 30*time.Second, func() error {
		n := network()
		if n.State != "up" || n.Repairs <= before {
			return fmt.Errorf("network is %s (%s), %d repairs", n.State, n.Error, n.Repairs)
		}
		if v, err := metric("vmnetctl_network_degraded"); err != nil || v != 0 {
			return fmt.Errorf("vmnetctl_network_degraded is %v (%v)", v, err)
		}
		if v, err := metric("vmnetctl_network_repairs_total"); err != nil || v <= float64(before) {
			return fmt.Errorf("vmnetctl_network_repairs_total is %v (%v), was %d", v, err, before)
		}
		return nil
	}, "repaired once the veth is gone")
	if out, _ := h.Run(context.Background(), "ip", "-d", "link", "show", br); !strings.Contains(out, "bridge") {
		t.Errorf("%s after the repair:\n%s", br, out)
	}
}

// TestIsolationDriftRepaired: on a network with isolation, a VM port's
// isolated flag taken away (bridge link set ... isolated off) lets its VM
// reach the others at layer 2. That is drift like any other, found on the
// event (the resync is an hour here): the network is repaired, the repair
// counted and logged, and the VMs cut off from each other again.
func TestIsolationDriftRepaired(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1h")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: isolated\n  b:\n    networks:\n      - vmnet: isolated\n")
	h.MustVmnetctl("up", "-f", vms)
	st := h.Status()
	a, b := h.Attachment(st, "a"), h.Attachment(st, "b")
	va, vb := h.VM(a), h.VM(b)
	la, lb := va.DHCP(t), vb.DHCP(t)
	// Each VM sends to the other straight over the bridge, not through
	// the gateway: a host route and a permanent neighbour.
	for _, p := range []struct {
		vm      *simvm.VM
		ip, mac string
	}{{va, lb["ip"], b.MAC}, {vb, la["ip"], a.MAC}} {
		p.vm.MustRun(t, "ip", "route", "replace", p.ip+"/32", "dev", "eth0")
		p.vm.MustRun(t, "ip", "neigh", "replace", p.ip, "lladdr", p.mac, "dev", "eth0", "nud", "permanent")
	}
	if err := va.Ping(lb["ip"], 1); err == nil {
		t.Fatal("a reaches b on an isolated network before any drift")
	}
	network := func() ctlapi.NetworkStatus { return h.network("isolated") }
	before := network().Repairs

	h.MustRun(t, "bridge", "link", "set", "dev", a.Tap, "isolated", "off")
	testutil.Eventually(t, 15*time.Second, func() error {
		if out, _ := h.Run(context.Background(), "ip", "-d", "link", "show", a.Tap); !strings.Contains(out, "isolated on") {
			return fmt.Errorf("%s is not isolated:\n%s", a.Tap, out)
		}
		if n := network(); n.State != "up" || n.Repairs <= before {
			return fmt.Errorf("network is %s (%s), %d repairs (was %d)", n.State, n.Error, n.Repairs, before)
		}
		return nil
	}, "the isolation of %s to be repaired", a.Tap)
	if err := va.Ping(lb["ip"], 1); err == nil {
		t.Error("a reaches b after the repair")
	}
	if out := h.MustVmnetctl("events"); !strings.Contains(out, "port "+a.Tap+" of bridge "+st.Networks[0].Bridge+" is not isolated") || !strings.Contains(out, "drift-repaired") {
		t.Errorf("events after the isolation drift:\n%s", out)
	}
}
