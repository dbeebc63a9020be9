package controller_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The WAN behind the host of TestHelperAsVmnetHelper: a documentation
// prefix, inside the test's namespaces only.
const (
	contractWANHost = "203.0.113.1"
	contractWANPeer = "203.0.113.2"
)

// helperCase is one way a vmnet-helper client starts `vmnetctl helper`.
type helperCase struct {
	name string
	args []string
	fd   bool // --fd (a socketpair) instead of --socket
	// The JSON line's addresses, the subnet and the DHCP range the VM's
	// lease must fall in.
	start, end, mask string
	subnet           string
	first, last      string
	shared           bool // NAT to the WAN; host mode must not reach it
}

// TestHelperAsVmnetHelper drives `vmnetctl helper` as a program written
// for vmnet-helper does, started on its own on a host with nothing up and
// the embedded networks.yaml: over --socket and --fd, shared and host mode
// with no address flags (vmnet's default networks), networks made on demand
// from /8, /12, /16 and /30 subnets (the last /30 of a range too) and a DHCP
// range that is a part of its subnet. For each: the JSON line's keys and
// values, a lease in the range with the gateway as router, the gateway
// answering, the WAN reached through NAT in shared mode and not in host
// mode, and nothing left once the helper is gone.
func TestHelperAsVmnetHelper(t *testing.T) {
	cases := []helperCase{
		{name: "shared defaults fd", fd: true, start: "192.168.105.1", end: "192.168.105.254", mask: "255.255.255.0",
			subnet: "192.168.105.0/24", first: "192.168.105.2", last: "192.168.105.254", shared: true},
		{name: "host defaults socket", args: []string{"--operation-mode", "host"}, start: "192.168.106.1", end: "192.168.106.254", mask: "255.255.255.0",
			subnet: "192.168.106.0/24", first: "192.168.106.2", last: "192.168.106.254"},
		{name: "shared /8", args: []string{"--operation-mode", "shared"}, start: "10.0.0.1", end: "10.255.255.254", mask: "255.0.0.0",
			subnet: "10.0.0.0/8", first: "10.0.0.2", last: "10.255.255.254", shared: true},
		{name: "host /12 fd", fd: true, args: []string{"--operation-mode", "host"}, start: "172.16.0.1", end: "172.31.255.254", mask: "255.240.0.0",
			subnet: "172.16.0.0/12", first: "172.16.0.2", last: "172.31.255.254"},
		{name: "shared /16 part of it", args: []string{"--operation-mode", "shared"}, start: "172.20.0.1", end: "172.20.0.20", mask: "255.255.0.0",
			subnet: "172.20.0.0/16", first: "172.20.0.2", last: "172.20.0.20", shared: true},
		{name: "host /30", args: []string{"--operation-mode", "host"}, start: "10.200.0.1", end: "10.200.0.2", mask: "255.255.255.252",
			subnet: "10.200.0.0/30", first: "10.200.0.2", last: "10.200.0.2"},
		{name: "shared last /30 of 172.16/12", fd: true, args: []string{"--operation-mode", "shared"}, start: "172.31.255.253", end: "172.31.255.254", mask: "255.255.255.252",
			subnet: "172.31.255.252/30", first: "172.31.255.254", last: "172.31.255.254", shared: true},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			t.Parallel()
			h := newContractHost(t)
			args := c.args
			if !strings.Contains(c.name, "defaults") {
				args = append(args, "--start-address", c.start, "--end-address", c.end, "--subnet-mask", c.mask)
			}
			hp := startContractHelper(t, h, "vm", c.fd, args...)
			for k, want := range map[string]string{"vmnet_start_address": c.start, "vmnet_end_address": c.end, "vmnet_subnet_mask": c.mask} {
				if got := hp.ready[k]; got != want {
					t.Errorf("JSON line: %s = %v, want %s\n%s", k, got, want, hp.line)
				}
			}
			for _, k := range []string{"vmnet_mac_address", "vmnet_mtu", "vmnet_max_packet_size", "vmnet_interface_id"} {
				if _, ok := hp.ready[k]; !ok {
					t.Errorf("JSON line has no %s: %s", k, hp.line)
				}
			}
			if p, ok := hp.ready["vmnet_nat66_prefix"].(string); ok != c.shared || (ok && !strings.HasPrefix(p, "fd")) {
				t.Errorf("JSON line: vmnet_nat66_prefix %q (present %v), want a ULA prefix in shared mode only", p, ok)
			}
			if mtu, max := hp.ready["vmnet_mtu"], hp.ready["vmnet_max_packet_size"]; mtu != 1500.0 || max != 1514.0 {
				t.Errorf("JSON line: vmnet_mtu %v, vmnet_max_packet_size %v, want 1500 and 1514", mtu, max)
			}
			lease := hp.vm.DHCP(t)
			if err := testutil.InRange(lease["ip"], c.first, c.last); err != nil {
				t.Errorf("lease: %v", err)
			}
			wantBits := strconv.Itoa(netip.MustParsePrefix(c.subnet).Bits())
			if lease["router"] != c.start || lease["mask"] != wantBits {
				t.Errorf("lease: router %s mask /%s, want %s and /%s", lease["router"], lease["mask"], c.start, wantBits)
			}
			if err := hp.vm.Ping(c.start, 1); err != nil {
				t.Errorf("the gateway %s does not answer: %v", c.start, err)
			}
			// The WAN has no route to the VMs: a reply comes back only
			// through the host's NAT.
			err := hp.vm.Ping(contractWANPeer, 1)
			if c.shared && err != nil {
				t.Errorf("shared mode: the WAN is not reached through NAT: %v", err)
			}
			if !c.shared && err == nil {
				t.Errorf("host mode: the VM reached the WAN")
			}
			if nets := h.Status().Networks; len(nets) != 1 || nets[0].Subnet != c.subnet {
				t.Errorf("status networks %+v, want one, %s", nets, c.subnet)
			}
			hp.stop(t)
			testutil.Eventually(t, 20*time.Second, func() error {
				if out, _ := h.Run(context.Background(), "ip", "-br", "link"); strings.Contains(out, "vmn-") {
					return fmt.Errorf("bridges left: %s", out)
				}
				return nil
			}, "the network to go with the helper")
		})
	}

	// Two helpers with isolation on one network made on demand reach the
	// gateway, not each other; a third joins it by name (--network, as
	// `vmnetctl networks` lists it) and gets the net_* keys.
	t.Run("isolation and --network", func(t *testing.T) {
		t.Parallel()
		h := newContractHost(t)
		flags := []string{"--operation-mode", "host", "--start-address", "10.90.0.1", "--end-address", "10.90.0.200", "--subnet-mask", "255.255.255.0", "--enable-isolation"}
		a := startContractHelper(t, h, "iso-a", false, flags...)
		b := startContractHelper(t, h, "iso-b", true, flags...)
		la, lb := a.vm.DHCP(t), b.vm.DHCP(t)
		for _, vm := range []*simvm.VM{a.vm, b.vm} {
			if err := vm.Ping("10.90.0.1", 1); err != nil {
				t.Errorf("%s: the gateway does not answer: %v", vm.Name, err)
			}
		}
		if err := a.vm.Ping(lb["ip"], 1); err == nil {
			t.Errorf("isolated VMs reach each other (%s to %s)", la["ip"], lb["ip"])
		}
		nets := h.Status().Networks
		if len(nets) != 1 || !strings.HasPrefix(nets[0].Name, "od-") {
			t.Fatalf("status networks %+v, want one made on demand", nets)
		}
		c := startContractHelper(t, h, "named", false, "--network", nets[0].Name)
		if c.ready["net_ipv4_subnet"] != "10.90.0.0" || c.ready["net_ipv4_mask"] != "255.255.255.0" {
			t.Errorf("--network %s: JSON line %s, want net_ipv4_subnet 10.90.0.0 and net_ipv4_mask 255.255.255.0", nets[0].Name, c.line)
		}
		if p, _ := c.ready["net_ipv6_prefix"].(string); p != nets[0].Subnet6[:len(nets[0].Subnet6)-len("/64")] || c.ready["net_ipv6_prefix_len"] != 64.0 {
			t.Errorf("--network %s: JSON line %s, want net_ipv6_prefix of %s and net_ipv6_prefix_len 64", nets[0].Name, c.line, nets[0].Subnet6)
		}
		lc := c.vm.DHCP(t)
		if err := c.vm.Ping(la["ip"], 1); err != nil {
			t.Errorf("the VM that joined by name (not isolated) cannot reach %s: %v", la["ip"], err)
		}
		a.stop(t)
		b.stop(t)
		if nets := h.Status().Networks; len(nets) != 1 {
			t.Errorf("after two of three helpers: networks %+v, want it still up (%s holds it)", nets, lc["ip"])
		}
		c.stop(t)
		testutil.Eventually(t, 20*time.Second, func() error {
			if out, _ := h.Run(context.Background(), "ip", "-br", "link"); strings.Contains(out, "vmn-") {
				return fmt.Errorf("bridges left: %s", out)
			}
			return nil
		}, "the network to go with its last helper")
	})
}

// newContractHost is a host with the embedded networks.yaml and a WAN
// namespace behind its uplink that has no route back to the VMs.
func newContractHost(t *testing.T) *host {
	h := &host{Host: simvm.NewHost(t, "vmnc", string(config.DefaultNetworks), "pgrep"), t: t}
	wan := testutil.NewNS(t, "wan")
	link(t, h, "uplink", contractWANHost+"/24", wan, contractWANPeer+"/24")
	h.MustRun(t, "ip", "route", "add", "default", "via", contractWANPeer)
	return h
}

// contractHelper is a running `vmnetctl helper` and its simulated VM.
type contractHelper struct {
	cmd   *exec.Cmd
	line  string
	ready map[string]any
	vm    *simvm.VM
}

// startContractHelper starts `vmnetctl helper ARGS` on h as a vmnet-helper
// client does, over a socket it names or a socketpair (--fd 3), and
// attaches a simulated VM once the JSON line is out.
func startContractHelper(t *testing.T, h *host, name string, fd bool, args ...string) *contractHelper {
	t.Helper()
	sock := filepath.Join(h.Dir, name+".sock")
	var vmEnd *net.UnixConn
	if fd {
		pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		helperEnd := os.NewFile(uintptr(pair[0]), "helper")
		vmFile := os.NewFile(uintptr(pair[1]), "vm")
		c, err := net.FileConn(vmFile)
		vmFile.Close()
		if err != nil {
			t.Fatal(err)
		}
		vmEnd = c.(*net.UnixConn)
		defer helperEnd.Close()
		args = append([]string{"helper", "--fd", "3"}, args...)
		cmd := h.VmnetctlCommand(context.Background(), args...)
		cmd.ExtraFiles = []*os.File{helperEnd}
		return runContractHelper(t, h, name, cmd, func(mac string) *simvm.VM { return simvm.AttachFD(t, name, mac, vmEnd) })
	}
	cmd := h.VmnetctlCommand(context.Background(), append([]string{"helper", "--socket", sock}, args...)...)
	return runContractHelper(t, h, name, cmd, func(mac string) *simvm.VM {
		return simvm.AttachSocket(t, name, mac, sock, filepath.Join(h.Dir, name+".client.sock"))
	})
}

// runContractHelper starts cmd, a `vmnetctl helper`, reads its JSON line
// and, with attach, attaches a simulated VM to it.
func runContractHelper(t *testing.T, h *host, name string, cmd *exec.Cmd, attach func(mac string) *simvm.VM) *contractHelper {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper %s %v: no JSON line: %v\n%s", name, cmd.Args, err, stderr.String())
	}
	hp := &contractHelper{cmd: cmd, line: line}
	if err := json.Unmarshal([]byte(line), &hp.ready); err != nil {
		t.Fatalf("JSON line %q: %v", line, err)
	}
	if attach != nil {
		mac, _ := hp.ready["vmnet_mac_address"].(string)
		hp.vm = attach(mac)
	}
	return hp
}

// stop ends the helper as its client does (SIGTERM) and waits for it.
func (hp *contractHelper) stop(t *testing.T) {
	t.Helper()
	hp.cmd.Process.Signal(syscall.SIGTERM)
	if err := hp.cmd.Wait(); err != nil {
		t.Errorf("helper after SIGTERM: %v", err)
	}
}

// TestListSharedInterfaces: `--list-shared-interfaces` prints the host
// interfaces a bridged network could use, one a line, as vmnet-helper
// does: the user's bridge, not loopback, a veth or vmnetctl's own bridges.
func TestListSharedInterfaces(t *testing.T) {
	h := newContractHost(t) // its uplink is a veth
	h.MustRun(t, "ip", "link", "add", "br-lan", "type", "bridge")
	h.MustVmnetctl("network", "create", "shared")
	out, err := h.Run(context.Background(), h.Binary, "helper", "--list-shared-interfaces")
	if err != nil {
		t.Fatalf("--list-shared-interfaces: %v\n%s", err, out)
	}
	if lines := strings.Fields(out); !slices.Equal(lines, []string{"br-lan"}) {
		t.Errorf("--list-shared-interfaces printed %q, want br-lan alone", out)
	}
}
