package controller_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

const forwardVMs = `
vms:
  web:
    networks:
      - vmnet: shared
        ip: %s
        portForwards:
          - guestPort: 8000
            hostPort: 18080
            hostIP: 0.0.0.0
          - guestPort: 8000
            hostPort: 18081
          - guestPort: 9000
            hostPort: 19000
            hostIP: 0.0.0.0
            proto: udp
  api:
    networks:
      - vmnet: shared
        portForwards:
          - guestPort: 8000
            hostPort: 18082
            hostIP: 0.0.0.0
  hv:
    networks:
      - vmnet: host
`

// serveHello answers every TCP connection to port in vm with "hello from
// VM" and closes it.
func serveHello(t *testing.T, vm *simvm.VM, port int) {
	serveText(t, vm.Listen(t, "tcp4", fmt.Sprintf(":%d", port)), "hello from VM")
}

// dialHello connects to addr from ns and returns what it read, or an error.
func dialHello(ns *testutil.NS, addr string) (string, error) { return ns.Exchange(addr, "") }

// TestPortForwards: a service in a VM is reached through the VM file's
// forwards from another machine (the WAN namespace), from the host at its
// own address and at its loopback; a forward on 127.0.0.1 (lima's
// default) from the host only; again after the VM's address changes; the
// connections are counted; a host port a program of the host listens on
// is refused at up.
func TestPortForwards(t *testing.T) {
	h := newContractHost(t) // the host's uplink 203.0.113.1, a WAN peer behind it
	wan := testutil.NewNS(t, "fwdwan")
	link(t, h, "lan", "198.51.100.1/24", wan, "198.51.100.2/24")

	vms := h.WriteFile("vms.yaml", fmt.Sprintf(forwardVMs, "192.168.105.20"))
	if out := h.MustVmnetctl("plan", "-f", vms); !strings.Contains(out, "forward 0.0.0.0:18080 -> 8000/tcp") {
		t.Errorf("plan does not show the forwards:\n%s", out)
	}
	h.MustVmnetctl("up", "-f", vms)
	vm := h.VM(h.Attachment(h.Status(), "web"))
	if ip := vm.DHCP(t)["ip"]; ip != "192.168.105.20" {
		t.Fatalf("lease %s, want the fixed 192.168.105.20", ip)
	}
	serveHello(t, vm, 8000)

	reach := func(what string, ns *testutil.NS, addr string, want bool) {
		t.Helper()
		got, err := dialHello(ns, addr)
		switch {
		case want && got != "hello from VM":
			t.Errorf("%s (%s): got %q, %v; want the VM's service", what, addr, got, err)
		case !want && err == nil && got != "":
			t.Errorf("%s (%s): reached the VM (%q); want no way through", what, addr, got)
		}
	}
	// api has no address when up applies the forwards: its forward
	// starts working when DHCP binds one.
	api := h.VM(h.Attachment(h.Status(), "api"))
	api.DHCP(t)
	serveHello(t, api, 8000)
	testutil.Eventually(t, 10*time.Second, func() error {
		if got, err := dialHello(wan, "198.51.100.1:18082"); got != "hello from VM" {
			return fmt.Errorf("api's forward: %q, %v", got, err)
		}
		return nil
	}, "api's forward to work once it leased an address")
	reach("from another machine", wan, "198.51.100.1:18080", true)
	udp := vm.ListenPacket(t, "udp4", ":9000")
	go func() { // UDP echo
		buf := make([]byte, 100)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			udp.WriteTo(buf[:n], from)
		}
	}()
	if err := wan.Do(func() error {
		c, err := net.Dial("udp4", "198.51.100.1:19000")
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 10)
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) != "ping" {
			err = fmt.Errorf("echoed %q", buf[:n])
		}
		return err
	}); err != nil {
		t.Errorf("the UDP forward from another machine: %v", err)
	}
	reach("from the host, at its address", h.NS, "198.51.100.1:18080", true)
	reach("from the host's loopback", h.NS, "127.0.0.1:18080", true)
	reach("the 127.0.0.1 forward from the host", h.NS, "127.0.0.1:18081", true)
	reach("the 127.0.0.1 forward from another machine", wan, "198.51.100.1:18081", false)

	// The VM's address changes: the forward follows.
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", fmt.Sprintf(forwardVMs, "192.168.105.21")))
	if ip := vm.DHCP(t)["ip"]; ip != "192.168.105.21" {
		t.Fatalf("lease after the change %s, want 192.168.105.21", ip)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if got, err := dialHello(wan, "198.51.100.1:18080"); got != "hello from VM" {
			return fmt.Errorf("from another machine after the address changed: %q, %v", got, err)
		}
		return nil
	}, "the forward to follow the VM's new address")

	var att ctlapi.AttachmentStatus
	for _, a := range h.Status().Attachments {
		if a.VM == "web" {
			att = a
		}
	}
	if len(att.Forwards) != 3 || att.Forwards[0].Forward != "0.0.0.0:18080 -> 8000/tcp" || att.Forwards[0].Connections < 4 || att.Forwards[1].Connections < 1 {
		t.Errorf("status forwards %+v, want 0.0.0.0:18080 with 4 or more connections and 127.0.0.1:18081 with 1 or more", att.Forwards)
	}

	// What forwards must not open. The host has a service on its loopback
	// only, and a container-like DNAT of someone else's; the VMs and the
	// LAN neighbour route 127.0.0.0/8 to the host (as a hostile guest or
	// neighbour would).
	hv := h.VM(h.Attachment(h.Status(), "hv"))
	hv.DHCP(t)
	serveText(t, h.Listen(t, "tcp4", "127.0.0.1:9999"), "host loopback secret")
	ctr := testutil.NewNS(t, "fwdctr")
	link(t, h, "docker0", "172.17.0.1/16", ctr, "172.17.0.2/16")
	ctr.MustRun(t, "ip", "route", "add", "default", "via", "172.17.0.1")
	serveText(t, ctr.Listen(t, "tcp4", ":9000"), "hello from container")
	h.MustRun(t, "nft", "add table ip dockerlike; add chain ip dockerlike pre { type nat hook prerouting priority dstnat; }; add rule ip dockerlike pre fib daddr type local tcp dport 9000 dnat to 172.17.0.2:9000")
	closed := func(what string, ns *testutil.NS, addr string) {
		if got, _ := dialHello(ns, addr); got != "" {
			t.Errorf("%s (%s): got %q; want no way through", what, addr, got)
		}
	}
	closed("a host-only VM to a container's published port", hv.NS, "192.168.106.1:9000")
	if got, err := dialHello(vm.NS, "192.168.105.1:9000"); got != "hello from container" {
		t.Errorf("a shared VM to a container's published port (control): %q, %v", got, err)
	}
	localnet(t, vm.NS, "192.168.105.1")
	localnet(t, hv.NS, "192.168.106.1")
	localnet(t, wan, "198.51.100.1")
	// In parallel: each waits for its dial to time out.
	var wg sync.WaitGroup
	for _, c := range []struct {
		what string
		ns   *testutil.NS
		addr string
	}{
		{"a shared VM to the host's loopback-only service", vm.NS, "127.0.0.1:9999"},
		{"a host-only VM to the host's loopback-only service", hv.NS, "127.0.0.1:9999"},
		{"a LAN neighbour to the host's loopback-only service", wan, "127.0.0.1:9999"},
		{"a LAN neighbour to the 127.0.0.1 forward", wan, "127.0.0.1:18081"},
		{"a host-only VM to the 127.0.0.1 forward", hv.NS, "127.0.0.1:18081"},
	} {
		wg.Go(func() { closed(c.what, c.ns, c.addr) })
	}
	wg.Wait()

	// A host port in use is refused, naming the file and the port.
	h.Listen(t, "tcp4", "0.0.0.0:18090")
	taken := h.WriteFile("taken.yaml", "vms:\n  other:\n    networks:\n      - vmnet: shared\n        portForwards:\n          - guestPort: 80\n            hostPort: 18090\n")
	if _, err := h.Vmnetctl("up", "-f", taken); err == nil || !strings.Contains(err.Error(), "taken.yaml:6: VM other forwards host port 18090/tcp, which is in use on the host") {
		t.Errorf("up with a host port in use: %v", err)
	}
	for _, a := range h.Status().Attachments {
		if a.VM == "other" {
			t.Errorf("the refused up recorded VM other: %+v", a)
		}
	}
}

// serveText answers every connection to ln with text.
func serveText(t *testing.T, ln net.Listener, text string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, text)
			c.Close()
		}
	}()
}

// localnet makes ns send 127.0.0.0/8 to via, as a hostile guest or
// neighbour would to reach the host's loopback.
func localnet(t *testing.T, ns *testutil.NS, via string) {
	ns.MustRun(t, "ip", "addr", "flush", "dev", "lo")
	ns.MustRun(t, "ip", "route", "add", "127.0.0.0/8", "via", via, "dev", "eth0")
	ns.MustRun(t, "sh", "-c", "for k in all/route_localnet eth0/route_localnet; do echo 1 > /proc/sys/net/ipv4/conf/$k; done; for k in all/rp_filter eth0/rp_filter; do echo 0 > /proc/sys/net/ipv4/conf/$k; done")
}

// TestForwardRemovedCutsConnections: a connection made through a forward
// ends when the forward goes (its conntrack entry is deleted): it does not
// keep reaching the VM.
func TestForwardRemovedCutsConnections(t *testing.T) {
	h := newContractHost(t)
	with := "vms:\n  web:\n    networks:\n      - vmnet: shared\n        portForwards:\n          - guestPort: 8001\n            hostPort: 18083\n"
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", with))
	vm := h.VM(h.Attachment(h.Status(), "web"))
	vm.DHCP(t)
	ln := vm.Listen(t, "tcp4", ":8001")
	go func() { // echo
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	var c net.Conn
	testutil.Eventually(t, 10*time.Second, func() error { // the forward follows the lease at once, not before
		return h.Do(func() (err error) { c, err = net.DialTimeout("tcp4", "127.0.0.1:18083", 3*time.Second); return err })
	}, "a connection through the forward")
	defer c.Close()
	echo := func(msg string) error {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return fmt.Errorf("echoed %q", buf)
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatalf("through the forward: %v", err)
	}
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  web:\n    networks:\n      - vmnet: shared\n"))
	if err := echo("after"); err == nil {
		t.Errorf("the connection still reaches the VM after its forward was removed")
	}
}
