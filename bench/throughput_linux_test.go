package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
	"github.com/vmnetctl/vmnetctl/helper"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The paths measured, each in namespaces of its own, iperf3's server on
// the "host" side and its client in the "VM" namespace ("vm→host" is the
// client sending, "host→vm" is -R):
//
//	veth:    vm ns 192.168.105.2 ── veth ── host ns 192.168.105.1
//
//	helper:  host ns: bridge vmn-shared 192.168.105.1 ── TAP ── helper (--fd 3)
//	                                                               │ socketpair
//	         vm ns:   bridge vmn-vmside 192.168.105.2 ── TAP ── helper (--fd 3)
//
//	slirp4netns: vm ns: tap0 10.0.2.100 ── slirp4netns (in host ns)
//	             ── host ns 127.0.0.1 (slirp's 10.0.2.2)
//
//	gvproxy: vm ns: bridge 192.168.127.2 ── TAP ── helper (--fd 3, plays vfkit)
//	             │ unixgram, "VFKT" hello
//	         gvproxy (in host ns) ── host ns 127.0.0.1 (gvproxy's 192.168.127.254)
//
// In the helper path the VM side is a second helper playing the VMM (as
// qemu -netdev dgram would), so a frame crosses two relays and two TAPs;
// in the gvproxy path a helper plays vfkit. slirp4netns reads the VM's TAP
// itself, as it does for podman. The two user-mode stacks end the VM's TCP
// connection and open their own to the host's loopback.

// How long iperf3 runs per direction: 5 s in the full run
// (VMNETCTL_BENCH=1), 1 s in the smoke run CI makes (VMNETCTL_BENCH=smoke),
// which checks every path and its counters but whose numbers mean little.
const (
	fullSeconds  = 5
	smokeSeconds = 1
)

// result is one iperf3 run: a path, a direction and what it cost.
type result struct {
	name, dir string
	gbps      float64
	cpuPerGB  float64 // CPU seconds of the relaying processes per GB moved
	cpuDetail string  // the same, per process
	drops     int64   // frames the helpers dropped, or -1
	// machinePerGB is the busy CPU seconds of the whole machine (every
	// process, the kernel's softirqs, and whatever else runs) per GB
	// moved, and busy the share of all CPUs' time that was busy: when a
	// path keeps every CPU busy, its Gbit/s over veth's is at most veth's
	// machinePerGB over its own.
	machinePerGB, busy float64
	err                string // why the path was not measured
}

// benchSeconds says how long each direction runs, from VMNETCTL_BENCH; ok
// is false when the benchmark was not asked for.
func benchSeconds(t *testing.T) (seconds int, ok bool) {
	switch v := os.Getenv("VMNETCTL_BENCH"); v {
	case "":
		return 0, false
	case "1":
		return fullSeconds, true
	case "smoke":
		return smokeSeconds, true
	default:
		t.Fatalf("VMNETCTL_BENCH=%q: want 1 (the full run) or smoke (1 s per direction)", v)
		return 0, false
	}
}

func TestThroughput(t *testing.T) {
	seconds, ok := benchSeconds(t)
	if !ok {
		// Not a missing prerequisite: the benchmark runs only when asked
		// (a minute of iperf3); CI asks for the smoke run.
		t.Skip("set VMNETCTL_BENCH=1 to run the benchmark, VMNETCTL_BENCH=smoke for its smoke run")
	}
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip", "iperf3")
	dir := t.TempDir()
	bin, err := testutil.BuildVmnetctl(dir)
	if err != nil {
		t.Fatal(err)
	}
	loadBefore := loadavg()
	began := time.Now()

	var results []result
	var names []string // every path, in order, for the table's check
	// Each path is a subtest, so a path that fails (a peer missing or
	// misbehaving) leaves a row saying why and the others still run; its
	// namespaces and processes go when the subtest ends.
	path := func(name string, f func(t *testing.T, measure measureFunc)) {
		ran := false
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			ran = true
			f(t, func(e endpoints, relays ...relay) {
				// Counters before the first run: wait for fresh stats lines.
				awaitStats(t, relays)
				for _, rl := range relays {
					if rl.helper != nil {
						t.Logf("%-26s %s: %d kB of private memory before traffic", name, rl.name, testutil.PrivateKB(t, rl.pid))
					}
				}
				for _, reverse := range []bool{false, true} {
					d := "vm→host"
					if reverse {
						d = "host→vm"
					}
					statsBefore := snapshots(relays)
					before := cpuTimes(t, relays)
					mBefore := machineTimes(t)
					ip := iperf(t, e, seconds, reverse)
					mAfter := machineTimes(t)
					after := cpuTimes(t, relays)
					// The counters then include every frame of the run.
					awaitStats(t, relays)
					statsAfter := snapshots(relays)
					gb := float64(ip.received) / 1e9
					r := result{name: name, dir: d, gbps: ip.gbps, drops: -1}
					busy := mAfter.busy - mBefore.busy
					r.machinePerGB, r.busy = busy/gb, busy/(mAfter.all-mBefore.all)
					var parts []string
					for i, rl := range relays {
						c := (after[i] - before[i]) / gb
						r.cpuPerGB += c
						parts = append(parts, fmt.Sprintf("%s %.2f", rl.name, c))
						if rl.helper != nil {
							if r.drops < 0 {
								r.drops = 0
							}
							r.drops += int64(statsAfter[i].Host.Drops + statsAfter[i].VM.Drops - statsBefore[i].Host.Drops - statsBefore[i].VM.Drops)
							checkCounters(t, rl, d, !reverse, statsBefore[i], statsAfter[i], ip)
						}
					}
					r.cpuDetail = strings.Join(parts, " + ")
					results = append(results, r)
					t.Logf("%-26s %s %6.2f Gbit/s, relays' CPU %.2f s/GB (%s), machine %.2f s/GB at %.0f%% busy, helpers' drops %d", name, d, ip.gbps, r.cpuPerGB, r.cpuDetail, r.machinePerGB, 100*r.busy, r.drops)
				}
				for _, rl := range relays {
					if rl.helper != nil {
						rl.helper.checkLines(t, rl.name)
					}
				}
			})
		})
		if ran { // (not when -run leaves it out)
			names = append(names, name)
			// A skipped or failed path still gets a row, so the table says so.
			measured := false
			for _, r := range results {
				measured = measured || r.name == name
			}
			if !measured {
				why := "failed, see the log"
				if r, ok := skipped[t.Name()+"/"+strings.ReplaceAll(name, " ", "_")]; ok {
					why = "not run: " + r
				}
				results = append(results, result{name: name, err: why})
			}
		}
	}

	// Baseline: veth.
	path("veth", func(t *testing.T, measure measureFunc) {
		hns, v := testutil.NewNS(t, "vb-host"), netns(t, "vb-vm")
		h := hns.Name
		testutil.Run(t, "ip", "-n", h, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", v)
		testutil.Run(t, "ip", "-n", h, "addr", "add", "192.168.105.1/24", "dev", "eth0")
		testutil.Run(t, "ip", "-n", v, "addr", "add", "192.168.105.2/24", "dev", "eth0")
		testutil.Run(t, "ip", "-n", h, "link", "set", "eth0", "up")
		testutil.Run(t, "ip", "-n", v, "link", "set", "eth0", "up")
		measure(endpoints{hns, "192.168.105.1", v, "192.168.105.1"})
	})

	// The helper paths run with the anti-spoofing guard on the host
	// helper's port, as every VM's port has it, pinned to the VM side's
	// MAC (the VM side's TAP sends a frame or two of its own); the row
	// without it says what the guard costs.
	for _, c := range []struct {
		name        string
		tso         bool
		extra, host []string
	}{
		{"helper", false, nil, []string{"--mac", vmSideMAC.String()}},
		{"helper, no spoof check", false, nil, []string{"--no-spoof-check"}},
		{"helper, no relay offloads", false, nil, []string{"--mac", vmSideMAC.String(), "--" + helper.NoRelayOffloadsFlag}},
		{"helper --enable-tso", true, []string{"--enable-tso"}, []string{"--mac", vmSideMAC.String()}},
	} {
		name, tso, extra := c.name, c.tso, c.extra
		path(name, func(t *testing.T, measure measureFunc) {
			hns, v := testutil.NewNS(t, "hb-host"), netns(t, "hb-vm")
			h := hns.Name
			fds := socketpair(t, tso)
			host := startHelper(t, bin, dir, fds[0], h, "shared", "192.168.105.1", false, append(slices.Clone(extra), c.host...))
			vm := startHelper(t, bin, dir, fds[1], v, "vmside", "192.168.105.2", true, extra)
			bindAddress(t, hns, vmSideMAC, "192.168.105.2")
			host.name, vm.name = "host helper", "vm helper"
			measure(endpoints{hns, "192.168.105.1", v, "192.168.105.1"}, host, vm)
		})
	}

	// What a real VM pays: one helper, and on the VM side a minimal VMM
	// relay (vmmRelay: blocking, one frame per read and write, as qemu's
	// -netdev dgram moves them) instead of a second helper.
	path("helper, one relay", func(t *testing.T, measure measureFunc) {
		hns, v := testutil.NewNS(t, "h1-host"), netns(t, "h1-vm")
		fds := socketpair(t, false)
		host := startHelper(t, bin, dir, fds[0], hns.Name, "shared", "192.168.105.1", false, []string{"--mac", vmSideMAC.String()})
		vmm := startVMMRelay(t, fds[1], v, vmSideMAC, "192.168.105.2")
		bindAddress(t, hns, vmSideMAC, "192.168.105.2")
		host.name = "host helper"
		measure(endpoints{hns, "192.168.105.1", v, "192.168.105.1"}, host, vmm)
	})

	// vhost-user: one helper, which reads and writes the guest's rings
	// itself (attach: vhost-user), and on the VM side a VMM stand-in
	// (vhostuser.Frontend) that moves each frame between the rings and
	// the VM's NIC, as qemu's vhost-user-net and the guest's driver do.
	// Next to "helper, one relay" it says what the socket's copies cost.
	// Without offloads the guest merges what it receives (GRO, as a Linux
	// guest does whatever its device offers), or, in the "no guest GRO"
	// row, hands each frame to its stack alone, as the other paths' VM
	// sides do (their VMM relays and slirp4netns write each frame to the
	// VM namespace's NIC). With offloads, the guest's NIC has checksum
	// offload and TSO, as a Linux guest's virtio-net driver negotiates
	// them, and its 64 KiB segments and virtio-net headers go through the
	// rings as they are.
	for _, c := range []struct{ name, guest string }{
		{"helper, vhost-user", guestGRO},
		{"helper, vhost-user, no guest GRO", guestPlain},
		{"helper, vhost-user, offloads", guestOffloads},
	} {
		name, guest := c.name, c.guest
		path(name, func(t *testing.T, measure measureFunc) {
			hns, v := testutil.NewNS(t, "hu-host"), netns(t, "hu-vm")
			sock := filepath.Join(dir, hns.Name+".sock")
			host := startHelper(t, bin, dir, -1, hns.Name, "shared", "192.168.105.1", false, []string{"--mac", vmSideMAC.String(), "--attach", "vhost-user", "--socket", sock})
			vmm := startVhostFrontend(t, sock, v, vmSideMAC, "192.168.105.2", guest)
			bindAddress(t, hns, vmSideMAC, "192.168.105.2")
			host.name = "host helper"
			measure(endpoints{hns, "192.168.105.1", v, "192.168.105.1"}, host, vmm)
		})
	}

	// vmnetctl run's kernel path for an `attach: tap` entry: the VMM takes
	// the TAP on the network's bridge itself (qemu's -netdev tap,fd=N) and
	// no helper relays; the same minimal VMM relay moves each frame between
	// that TAP and the VM's NIC. Next to "helper, one relay" it says what
	// the helper's hop costs a VM. The port is guarded, as every VM's is.
	path("kernel path (TAP fd), one relay", func(t *testing.T, measure measureFunc) {
		hns, v := testutil.NewNS(t, "kp-host"), netns(t, "kp-vm")
		br := api.BridgeName("shared")
		testutil.Run(t, "ip", "-n", hns.Name, "link", "add", br, "type", "bridge")
		testutil.Run(t, "ip", "-n", hns.Name, "addr", "add", "192.168.105.1/24", "dev", br)
		testutil.Run(t, "ip", "-n", hns.Name, "link", "set", br, "up")
		var fd int
		if err := hns.Do(func() (err error) {
			if fd, err = testutil.OpenTAP("tap0"); err != nil {
				return err
			}
			n := &api.Network{ID: "shared", Mode: api.ModeShared, DHCP: true}
			return guard.AddPort(t.Context(), n, "tap0", vmSideMAC)
		}); err != nil {
			t.Fatal(err)
		}
		testutil.Run(t, "ip", "-n", hns.Name, "link", "set", "tap0", "master", br, "up")
		vmm := startVMMRelay(t, fd, v, vmSideMAC, "192.168.105.2")
		bindAddress(t, hns, vmSideMAC, "192.168.105.2")
		measure(endpoints{hns, "192.168.105.1", v, "192.168.105.1"}, vmm)
	})

	// VM to VM: two VMs on one bridge, each behind its own helper and VMM
	// relay (the third column vmnet-helper reports). "vm→host" is the first
	// VM sending to the second.
	path("VM to VM", func(t *testing.T, measure measureFunc) {
		hns, v1, v2 := testutil.NewNS(t, "vv-host"), netns(t, "vv-vm1"), testutil.NewNS(t, "vv-vm2")
		mac2 := net.HardwareAddr{0x52, 0x55, 0x55, 0xbe, 0x00, 0x03}
		fds1, fds2 := socketpair(t, false), socketpair(t, false)
		h1 := startHelperOn(t, bin, dir, fds1[0], hns.Name, "shared", "192.168.105.1", "tap0", false, []string{"--mac", vmSideMAC.String()})
		h2 := startHelperOn(t, bin, dir, fds2[0], hns.Name, "shared", "192.168.105.1", "tap1", false, []string{"--mac", mac2.String()})
		r1 := startVMMRelay(t, fds1[1], v1, vmSideMAC, "192.168.105.2")
		r2 := startVMMRelay(t, fds2[1], v2.Name, mac2, "192.168.105.3")
		bindAddress(t, hns, vmSideMAC, "192.168.105.2")
		bindAddress(t, hns, mac2, "192.168.105.3")
		h1.name, h2.name, r1.name, r2.name = "helper 1", "helper 2", "vmm relay 1", "vmm relay 2"
		// The second VM's helper carries the first one's data towards
		// its VM: its counters read the other way round.
		h2.helper.vmSide = true
		measure(endpoints{v2, "192.168.105.3", v1, "192.168.105.3"}, h1, h2, r1, r2)
	})

	// slirp4netns: the "VM" namespace's tap0 is slirp's; slirp runs in a
	// host namespace of our own, and its gateway 10.0.2.2 is that
	// namespace's loopback (no --disable-host-loopback), where iperf3
	// listens. MTU 1500 is slirp4netns' default and what podman and
	// rootlesskit users get unless they raise it; 65520 is the tuned value
	// slirp4netns' README recommends.
	for _, mtu := range []int{1500, 65520} {
		name := fmt.Sprintf("slirp4netns mtu %d", mtu)
		path(name, func(t *testing.T, measure measureFunc) {
			if _, err := exec.LookPath("slirp4netns"); err != nil {
				missing(t, "slirp4netns", testutil.InstallHint("slirp4netns"))
			}
			hns, vns := testutil.NewNS(t, "sb-host"), testutil.NewNS(t, "sb-vm")
			pid := startSlirp(t, hns.Name, vns.Path(), mtu)
			measure(endpoints{hns, "127.0.0.1", vns.Name, "10.0.2.2"}, relay{name: "slirp4netns", pid: pid})
		})
	}

	// gvproxy: it listens for a vfkit-style peer on a unix datagram
	// socket (one raw frame per datagram after a "VFKT" hello). The VMM is
	// played by a helper in the "VM" namespace on a socket connected to
	// gvproxy's, as vfkit's would be, so a frame crosses one TAP, one
	// helper and gvproxy's user-mode TCP/IP stack. gvproxy maps
	// 192.168.127.254 to its namespace's 127.0.0.1, where iperf3 listens.
	//
	// A unix datagram socket's receive queue holds at most
	// net.unix.max_dgram_qlen datagrams (10 by default, per network
	// namespace, taken when the socket is made), and gvproxy reads one
	// datagram at a time: the helper's sends towards it fill that queue,
	// back off and drop. The second run raises the limit in gvproxy's
	// namespace only, to show what the default costs.
	for _, qlen := range []int{0, 512} {
		name := "gvproxy"
		if qlen > 0 {
			name = fmt.Sprintf("gvproxy max_dgram_qlen %d", qlen)
		}
		path(name, func(t *testing.T, measure measureFunc) {
			gv := gvproxyPath()
			if gv == "" {
				missing(t, "gvproxy", "run test/setup.sh, which installs gvproxy "+gvproxyVersion+" into bin/tools, or set VMNETCTL_BENCH_GVPROXY")
			}
			hns, v := testutil.NewNS(t, "gb-host"), netns(t, "gb-vm")
			h := hns.Name
			if qlen > 0 {
				testutil.Run(t, "ip", "netns", "exec", h, "sysctl", "-qw", fmt.Sprintf("net.unix.max_dgram_qlen=%d", qlen))
			}
			if out, err := exec.Command(gv, "-version").CombinedOutput(); err == nil {
				t.Logf("%s: %s", gv, strings.TrimSpace(string(out)))
			}
			sock, pid := startGvproxy(t, gv, h)
			fd := vfkitClient(t, sock)
			vm := startHelper(t, bin, dir, fd, v, "vmside", "192.168.127.2", true, nil)
			vm.name = "vm helper"
			measure(endpoints{hns, "127.0.0.1", v, "192.168.127.254"}, relay{name: "gvproxy", pid: pid}, vm)
		})
	}

	checkTable(t, names, results)

	// The table for docs/performance.md.
	base := map[string]float64{}
	for _, r := range results {
		if r.name == "veth" {
			base[r.dir] = r.gbps
		}
	}
	mode := "full run"
	if seconds == smokeSeconds {
		mode = "smoke run"
	}
	fmt.Printf("\n%s, %d s per direction; load average before: %s, after: %s; %d CPUs; %s\n", mode, seconds, loadBefore, loadavg(), runtime.NumCPU(), time.Since(began).Round(time.Second))
	fmt.Printf("\n| path | direction | Gbit/s | vs veth | relays' CPU s/GB | per process | machine CPU s/GB (busy) | helpers' drops |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		if r.err != "" {
			fmt.Printf("| %s | - | - | - | - | %s | - | - |\n", r.name, r.err)
			continue
		}
		cpu, detail, ratio := "-", "-", "-"
		if r.cpuDetail != "" {
			cpu, detail = fmt.Sprintf("%.2f", r.cpuPerGB), r.cpuDetail
		}
		if base[r.dir] > 0 {
			ratio = fmt.Sprintf("%.0f%%", 100*r.gbps/base[r.dir])
		}
		drops := "-"
		if r.drops >= 0 {
			drops = strconv.FormatInt(r.drops, 10)
		}
		machine := fmt.Sprintf("%.2f (%.0f%%)", r.machinePerGB, 100*r.busy)
		fmt.Printf("| %s | %s | %.2f | %s | %s | %s | %s | %s |\n", r.name, r.dir, r.gbps, ratio, cpu, detail, machine, drops)
	}
}

// checkTable fails the test unless the table has, for every path, a row
// per direction, or (for a path that did not run: a missing peer, which
// with CI=true fails the path, or a failure) the one row saying why.
func checkTable(t *testing.T, names []string, results []result) {
	t.Helper()
	for _, name := range names {
		var dirs []string
		reason := ""
		for _, r := range results {
			if r.name != name {
				continue
			}
			if r.err != "" {
				reason = r.err
				continue
			}
			dirs = append(dirs, r.dir)
		}
		switch {
		case reason != "" && len(dirs) == 0:
			// The subtest skipped (no CI) or failed, and says so.
		case strings.Join(dirs, " ") != "vm→host host→vm":
			t.Errorf("table: path %q has rows %q (and %q), want one vm→host and one host→vm", name, dirs, reason)
		}
	}
}

// endpoints says where iperf3's server listens (namespace and address) and
// what the client in the VM namespace connects to.
type endpoints struct {
	hostNS       *testutil.NS
	listen       string
	vmNS, target string
}

// relay is a process that moves the frames, whose CPU time is counted.
type relay struct {
	name string
	pid  int
	// helper, for a helper, is what its stats lines say.
	helper *helperStats
}

// helperStats follows a helper's stats lines on its stderr.
type helperStats struct {
	// vmSide is true for a helper whose TAP is in the VM namespace (its
	// own "VM" is the host side: the other helper, or gvproxy): the
	// frames from the VM namespace are then its host counters.
	vmSide bool

	mu    sync.Mutex
	last  helperproto.Stats
	lines int64
	bad   []string // "[stats]" lines that did not parse
}

// snapshot is the helper's latest counters and how many stats lines it
// has written.
func (h *helperStats) snapshot() (helperproto.Stats, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last, h.lines
}

// checkLines fails the test if a stats line of the helper did not parse.
func (h *helperStats) checkLines(t *testing.T, name string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.bad {
		t.Errorf("%s wrote a stats line that does not parse: %q", name, l)
	}
}

// counters are, of s, the counters of the frames a run moved in its data's
// direction (vm→host when vmToHost) and in the other (the ACKs).
func (h *helperStats) counters(s helperproto.Stats, vmToHost bool) (data, acks helperproto.Counters) {
	if vmToHost == h.vmSide {
		return s.Host, s.VM
	}
	return s.VM, s.Host
}

// Bounds of what a helper forwards for an iperf3 run, in bytes of Ethernet
// frames. Each TCP segment carries at most the MSS (1448 bytes at MTU
// 1500, with timestamps) in a frame of 14 + 20 + 32 bytes more; with TSO a
// frame carries up to 64 KiB under one header, so less overhead.
const (
	mss        = 1448
	frameOfMSS = 1514
	// controlSlack covers what is not the test's data: iperf3's control
	// connection (its parameters and results as JSON), ARP and IPv6's
	// chatter, handshakes and FINs.
	controlSlack = 256 << 10
	// dupSlack is the share of sent bytes a helper may forward more than
	// once beyond the retransmissions the sender counts: retransmissions
	// of a TCP stack iperf3 does not see (gvproxy's and slirp's own, towards
	// the VM), and segments resent after the frames were counted here but
	// lost further on.
	dupSlack = 0.10
)

// checkCounters checks one helper's counters against one iperf3 run: the
// run's data crossed it, so its frames in the data's direction hold at
// least the payload iperf3 received and at most what the sender sent and
// resent with its headers; and the other way it forwarded frames (ACKs).
func checkCounters(t *testing.T, rl relay, dir string, vmToHost bool, before, after helperproto.Stats, ip iperfResult) {
	t.Helper()
	b, backBefore := rl.helper.counters(before, vmToHost)
	a, backAfter := rl.helper.counters(after, vmToHost)
	if a.Bytes < b.Bytes || a.Packets < b.Packets {
		t.Errorf("%s %s: its counters went back, %+v then %+v", rl.name, dir, b, a)
		return
	}
	bytes, packets := int64(a.Bytes-b.Bytes), int64(a.Packets-b.Packets)
	limit := int64(float64(ip.sent+ip.retransmits*mss)*(1+dupSlack)*frameOfMSS/mss) + controlSlack
	t.Logf("%s %s: forwarded %d frames, %d bytes: %.3f × the %d bytes iperf3 received, %.3f × the limit (%d sent, %d segments resent); %d frames back",
		rl.name, dir, packets, bytes, float64(bytes)/float64(ip.received), ip.received, float64(bytes)/float64(limit), ip.sent, ip.retransmits, backAfter.Packets-backBefore.Packets)
	if bytes < ip.received {
		t.Errorf("%s %s: forwarded %d bytes of frames (%d frames), fewer than the %d bytes of payload iperf3 received through it: its counters miss frames",
			rl.name, dir, bytes, packets, ip.received)
	}
	if bytes > limit {
		t.Errorf("%s %s: forwarded %d bytes of frames, more than the %d bytes iperf3 sent (%d segments resent) with headers allow (%d): its counters count frames it did not forward, or twice",
			rl.name, dir, bytes, ip.sent, ip.retransmits, limit)
	}
	if backAfter.Packets <= backBefore.Packets {
		t.Errorf("%s %s: forwarded no frame the other way (the receiver's ACKs)", rl.name, dir)
	}
}

type measureFunc func(e endpoints, relays ...relay)

// skipped holds why a subtest skipped, for the table.
var skipped = map[string]string{}

// missing records what a path lacks for the table, then skips the path's
// subtest, or fails it with CI=true (testutil.Missing).
func missing(t *testing.T, what, install string) {
	skipped[t.Name()] = "needs " + what
	testutil.Missing(t, what, install)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// socketpair is the VMM's socketpair with the buffers `vmnetctl run` gives
// it (helperproto.SetSocketBuffers), unless VMNETCTL_BENCH_SNDBUF says
// otherwise. A helper on --fd sizes its own end again; the other end's
// SO_SNDBUF bounds what the VMM has in flight to the helper.
func socketpair(t *testing.T, tso bool) [2]int {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		setBuffers(t, fd, tso)
	}
	return fds
}

func setBuffers(t *testing.T, fd int, tso bool) {
	if err := helperproto.SetSocketBuffers(fd, tso); err != nil {
		t.Fatal(err)
	}
	if v, err := strconv.Atoi(os.Getenv("VMNETCTL_BENCH_SNDBUF")); err == nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, v); err != nil {
			t.Fatal(err)
		}
	}
}

// vmSideMAC is the MAC of the VM side's bridge: what the host helper's
// guarded port sees the "VM" send from.
var vmSideMAC = net.HardwareAddr{0x52, 0x55, 0x55, 0xbe, 0x00, 0x02}

// startHelper puts a bridge named for network id with addr in ns (marked
// as the data plane marks it), and a helper on fd with its TAP on that
// bridge, whose stats lines it follows. vmSide says the namespace is the
// VM's: its helper stands in for the VMM, not for a VM's port, so its port
// is not guarded.
func startHelper(t *testing.T, bin, dir string, fd int, ns, id, addr string, vmSide bool, extra []string) relay {
	return startHelperOn(t, bin, dir, fd, ns, id, addr, "tap0", vmSide, extra)
}

// startHelperOn is startHelper with the TAP's name; a second helper on the
// same bridge (another TAP) finds the bridge made.
func startHelperOn(t *testing.T, bin, dir string, fd int, ns, id, addr, tap string, vmSide bool, extra []string) relay {
	t.Helper()
	// One networks.yaml per side: the two are one subnet seen from two
	// namespaces.
	ip := net.ParseIP(addr).To4()
	end := net.IPv4(ip[0], ip[1], ip[2], 253).String()
	cfg := filepath.Join(dir, fmt.Sprintf("%s-%s.yaml", id, ns))
	if err := os.WriteFile(cfg, []byte("networks:\n  "+id+": {mode: shared, gateway: "+addr+", dhcpEnd: "+end+", netmask: 255.255.255.0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	br := api.BridgeName(id)
	if vmSide {
		// It plays the VMM: its TAP is the guest's NIC, which neither
		// checks nor merges what it is given (a guest's own GRO would,
		// on the guest's CPUs), nor takes 64 KiB packets.
		extra = append(slices.Clone(extra), "--no-spoof-check", "--"+helper.NoRelayOffloadsFlag)
	}
	if exec.Command("ip", "-n", ns, "link", "show", br).Run() != nil {
		testutil.Run(t, "ip", "-n", ns, "link", "add", br, "type", "bridge")
		testutil.Run(t, "ip", "-n", ns, "link", "set", br, "alias", "vmnetctl:network="+id)
		if vmSide {
			testutil.Run(t, "ip", "-n", ns, "link", "set", br, "address", vmSideMAC.String())
		}
		testutil.Run(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", br)
		testutil.Run(t, "ip", "-n", ns, "link", "set", br, "up")
	}
	args := []string{"netns", "exec", ns, bin, "--networks", cfg, "helper", "--network", id, "--tap", tap, "--stats-interval", strconv.FormatFloat(statsInterval.Seconds(), 'f', -1, 64)}
	var files []*os.File
	if fd >= 0 { // (none: extra says where its socket is)
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		args, files = append(args, "--fd", "3"), []*os.File{f}
	}
	cmd := exec.Command("ip", append(args, extra...)...)
	// As the controller runs helpers: the bench makes the network itself.
	cmd.Env = append(os.Environ(), helperproto.EnvUnderController+"=1")
	cmd.ExtraFiles = files
	hs := &helperStats{vmSide: vmSide}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		// The periodic stats lines feed the counters; the rest, and the
		// last stats line, go to stderr.
		sc := bufio.NewScanner(stderr)
		last := ""
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "[stats]") {
				fmt.Fprintln(os.Stderr, line)
				continue
			}
			last = line
			st, ok := helperproto.ParseStatsLine(line)
			hs.mu.Lock()
			if ok {
				hs.last = st
				hs.lines++
			} else {
				hs.bad = append(hs.bad, line)
			}
			hs.mu.Unlock()
		}
		if last != "" {
			fmt.Fprintln(os.Stderr, last)
		}
	}()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start(t, cmd)
	line := make(chan bool, 1)
	go func() { line <- bufio.NewScanner(out).Scan() }()
	select {
	case ok := <-line:
		if !ok {
			t.Fatal("helper exited before its ready line")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ready line in 10s")
	}
	return relay{pid: cmd.Process.Pid, helper: hs}
}

// statsInterval is how often the helpers log their counters, so the
// counters of each direction can be told apart.
const statsInterval = 250 * time.Millisecond

// awaitStats waits until the counters of every helper among relays
// include every frame of the run that just ended: two more stats lines
// (the first may have been written while its last frames were still in
// flight), or, once quietSpell has passed since the call, none for that
// long (a helper writes a line every interval while its counters move,
// and then only every heartbeat: its latest line is final).
func awaitStats(t *testing.T, relays []relay) {
	t.Helper()
	const quietSpell = 4 * statsInterval
	called := time.Now()
	for _, r := range relays {
		if r.helper == nil {
			continue
		}
		_, n := r.helper.snapshot()
		testutil.Eventually(t, time.Minute, func() bool {
			s, m := r.helper.snapshot()
			return m >= n+2 || time.Since(called) >= quietSpell && time.Since(s.Time) >= quietSpell
		}, "%s's counters to settle", r.name)
	}
}

// snapshots is the latest counters of each relay (zero for one that is not
// a helper).
func snapshots(relays []relay) []helperproto.Stats {
	s := make([]helperproto.Stats, len(relays))
	for i, r := range relays {
		if r.helper != nil {
			s[i], _ = r.helper.snapshot()
		}
	}
	return s
}

// start starts cmd and stops it (SIGTERM, then SIGKILL after 5 s) when
// the test ends, whatever happened. `ip netns exec` execs the command, so
// the pid is the command's.
func start(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}

// startSlirp runs slirp4netns in hostNS for the tap0 of the namespace at vmNSPath and waits for it
// to say it is ready (--ready-fd). --exit-fd makes it exit if the test
// dies without its cleanup.
func startSlirp(t *testing.T, hostNS, vmNSPath string, mtu int) int {
	t.Helper()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	exitR, exitW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", hostNS, "slirp4netns", "--configure", "--mtu="+strconv.Itoa(mtu),
		"--ready-fd=3", "--exit-fd=4", "--netns-type=path", vmNSPath, "tap0")
	cmd.ExtraFiles = []*os.File{readyW, exitR}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start(t, cmd)
	t.Cleanup(func() { exitW.Close() })
	readyW.Close()
	exitR.Close()
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := readyR.Read(b)
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("slirp4netns did not become ready: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("slirp4netns not ready in 10s\n%s", stderr.String())
	}
	readyR.Close()
	return cmd.Process.Pid
}

// gvproxyVersion is the gvproxy test/setup.sh installs into bin/tools
// (keep the two in step).
const gvproxyVersion = "v0.8.9"

// gvproxyPath finds gvproxy: $VMNETCTL_BENCH_GVPROXY, bin/tools/gvproxy of
// this repository (test/setup.sh puts it there), PATH, or where podman's
// packages put it.
func gvproxyPath() string {
	if p := os.Getenv("VMNETCTL_BENCH_GVPROXY"); p != "" {
		return p
	}
	candidates := []string{"/usr/libexec/podman/gvproxy", "/usr/lib/podman/gvproxy"}
	if p, err := exec.LookPath("gvproxy"); err == nil {
		candidates = append([]string{p}, candidates...)
	}
	if root := moduleRoot(); root != "" {
		candidates = append([]string{filepath.Join(root, "bin", "tools", "gvproxy")}, candidates...)
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// moduleRoot is the directory of the go.mod above the test's working
// directory (go test runs a test in its package's directory).
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// startGvproxy runs gvproxy in ns with a vfkit socket and returns the
// socket's path, once it exists, and gvproxy's pid. Its SSH forward (127.0.0.1:2222 in ns) is
// left on: it is in a namespace of ours and carries nothing here.
func startGvproxy(t *testing.T, gv, ns string) (string, int) {
	t.Helper()
	// A short path: sun_path holds 108 bytes and t.TempDir can be long.
	sdir, err := os.MkdirTemp("", "vb-gv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdir) })
	sock := filepath.Join(sdir, "gv.sock")
	cmd := exec.Command("ip", "netns", "exec", ns, gv, "-mtu", "1500", "-listen-vfkit", "unixgram://"+sock)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start(t, cmd)
	testutil.Eventually(t, 10*time.Second, func() error {
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		if exited(cmd.Process.Pid) {
			return testutil.Permanent(fmt.Errorf("gvproxy exited\n%s", stderr.String()))
		}
		return nil
	}, "gvproxy to make its socket")
	return sock, cmd.Process.Pid
}

// exited says whether the child pid has exited (a zombie its cleanup will
// reap).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// vfkitClient is what vfkit does: a unix datagram socket bound to a path
// of its own, connected to gvproxy's, announcing itself with "VFKT".
// Its buffers are the helper's (it is the helper's --fd, and the helper
// sizes its own end).
func vfkitClient(t *testing.T, server string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	setBuffers(t, fd, false)
	local := filepath.Join(filepath.Dir(server), "vm.sock")
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: local}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: server}); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, []byte("VFKT")); err != nil {
		t.Fatal(err)
	}
	return fd
}

// netns makes a namespace for the test and returns its name for iproute2.
func netns(t *testing.T, label string) string { return testutil.NewNS(t, label).Name }

// cpuTimes is the user+system CPU seconds of each relay.
func cpuTimes(t *testing.T, relays []relay) []float64 {
	var times []float64
	for _, r := range relays {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.pid))
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		// Fields after the command name (which may hold spaces): utime and
		// stime are the 14th and 15th fields of the line.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		times = append(times, (ut+st)/100) // USER_HZ
	}
	return times
}

// cpuClock is the machine's CPU time in seconds: busy (all but idle,
// iowait and steal, the time a hypervisor gave another guest) and all,
// summed over its CPUs.
type cpuClock struct{ busy, all float64 }

// machineTimes reads the first line of /proc/stat.
func machineTimes(t *testing.T) cpuClock {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		t.Fatalf("/proc/stat begins %q", line)
	}
	var c cpuClock
	// user nice system idle iowait irq softirq steal (guest time is in
	// user already).
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %v", err)
		}
		c.all += n / 100 // USER_HZ
		if i != 3 && i != 4 && i != 7 {
			c.busy += n / 100
		}
	}
	return c
}

// iperfResult is what one iperf3 run reports.
type iperfResult struct {
	gbps        float64 // the receiver's Gbit/s
	received    int64   // bytes the receiver read
	sent        int64   // bytes the sender wrote
	retransmits int64   // segments the sender's TCP resent
}

// iperf runs iperf3 for seconds, once, and returns what it reports. It
// fails the test unless iperf3 finished without error and moved data.
func iperf(t *testing.T, e endpoints, seconds int, reverse bool) iperfResult {
	t.Helper()
	var srvOut bytes.Buffer
	srv := exec.Command("ip", "netns", "exec", e.hostNS.Name, "iperf3", "-s", "-1", "-B", e.listen)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	srvDone := make(chan struct{})
	go func() { srv.Wait(); close(srvDone) }()
	defer func() { srv.Process.Kill(); <-srvDone }()
	// One client, once the one-off server listens: a client that fails is
	// the path failing, and no retry adds to what the relays counted.
	testutil.Eventually(t, 10*time.Second, func() error {
		select {
		case <-srvDone:
			return testutil.Permanent(fmt.Errorf("iperf3's server exited:\n%s", srvOut.String()))
		default:
		}
		if !e.hostNS.ListeningTCP(5201) {
			return errors.New("not listening on port 5201")
		}
		return nil
	}, "iperf3's server in %s", e.hostNS)
	args := []string{"netns", "exec", e.vmNS, "iperf3", "-c", e.target, "-t", strconv.Itoa(seconds), "-J"}
	if reverse {
		args = append(args, "-R")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+20)*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).Output()
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Bytes       int64 `json:"bytes"`
				Retransmits int64 `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil || res.Error != "" {
		t.Fatalf("ip %s: %v %v %s\n%s\nserver:\n%s", strings.Join(args, " "), err, jerr, res.Error, out, srvOut.String())
	}
	r := iperfResult{
		gbps:        res.End.SumReceived.BitsPerSecond / 1e9,
		received:    res.End.SumReceived.Bytes,
		sent:        res.End.SumSent.Bytes,
		retransmits: res.End.SumSent.Retransmits,
	}
	if r.sent <= 0 || r.received <= 0 || r.gbps <= 0 {
		t.Fatalf("iperf3 moved nothing: sent %d bytes, received %d (%.3f Gbit/s)\n%s", r.sent, r.received, r.gbps, out)
	}
	if r.received > r.sent {
		t.Fatalf("iperf3 received %d bytes, more than the %d sent\n%s", r.received, r.sent, out)
	}
	return r
}
