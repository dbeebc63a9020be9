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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
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

const seconds = 5

// result is one iperf3 run: a path, a direction and what it cost.
type result struct {
	name, dir string
	gbps      float64
	cpuPerGB  float64 // CPU seconds of the relaying processes per GB moved
	cpuDetail string  // the same, per process
	drops     int64   // frames the helpers dropped, or -1
	err       string  // why the path was not measured
}

func TestThroughput(t *testing.T) {
	if os.Getenv("VMNETCTL_BENCH") == "" {
		// Not a missing prerequisite: the benchmark runs only when asked
		// (minutes of iperf3), even in CI.
		t.Skip("set VMNETCTL_BENCH=1 to run the benchmark")
	}
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip", "iperf3")
	dir := t.TempDir()
	bin, err := testutil.Build(dir, testutil.VmnetctlPackage)
	if err != nil {
		t.Fatal(err)
	}
	loadBefore := loadavg()
	began := time.Now()

	var results []result
	// Each path is a subtest, so a path that fails (a peer missing or
	// misbehaving) leaves a row saying why and the others still run; its
	// namespaces and processes go when the subtest ends.
	path := func(name string, f func(t *testing.T, measure measureFunc)) {
		ran := false
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			ran = true
			f(t, func(e endpoints, relays ...relay) {
				for _, reverse := range []bool{false, true} {
					d := "vm→host"
					if reverse {
						d = "host→vm"
					}
					before := cpuTimes(t, relays)
					dropsBefore, _ := dropped(relays)
					g, n := iperf(t, e, reverse)
					after := cpuTimes(t, relays)
					awaitStats(t, relays)
					dropsAfter, known := dropped(relays)
					gb := float64(n) / 1e9
					r := result{name: name, dir: d, gbps: g, drops: -1}
					if known {
						r.drops = dropsAfter - dropsBefore
					}
					var parts []string
					for i, rl := range relays {
						c := (after[i] - before[i]) / gb
						r.cpuPerGB += c
						parts = append(parts, fmt.Sprintf("%s %.2f", rl.name, c))
					}
					r.cpuDetail = strings.Join(parts, " + ")
					results = append(results, r)
					t.Logf("%-26s %s %6.2f Gbit/s, relays' CPU %.2f s/GB (%s), helpers' drops %d", name, d, g, r.cpuPerGB, r.cpuDetail, r.drops)
				}
			})
		})
		if ran {
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
		h, v := netns(t, "vb-host"), netns(t, "vb-vm")
		testutil.Run(t, "ip", "-n", h, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", v)
		testutil.Run(t, "ip", "-n", h, "addr", "add", "192.168.105.1/24", "dev", "eth0")
		testutil.Run(t, "ip", "-n", v, "addr", "add", "192.168.105.2/24", "dev", "eth0")
		testutil.Run(t, "ip", "-n", h, "link", "set", "eth0", "up")
		testutil.Run(t, "ip", "-n", v, "link", "set", "eth0", "up")
		measure(endpoints{h, "192.168.105.1", v, "192.168.105.1"})
	})

	for _, tso := range []bool{false, true} {
		name := "helper"
		var extra []string
		if tso {
			name, extra = "helper --enable-tso", []string{"--enable-tso"}
		}
		path(name, func(t *testing.T, measure measureFunc) {
			h, v := netns(t, "hb-host"), netns(t, "hb-vm")
			fds := socketpair(t, tso)
			host := startHelper(t, bin, dir, fds[0], h, "shared", "192.168.105.1", extra)
			vm := startHelper(t, bin, dir, fds[1], v, "vmside", "192.168.105.2", extra)
			host.name, vm.name = "host helper", "vm helper"
			measure(endpoints{h, "192.168.105.1", v, "192.168.105.1"}, host, vm)
		})
	}

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
			h, vns := netns(t, "sb-host"), testutil.NewNS(t, "sb-vm")
			v := vns.Name
			pid := startSlirp(t, h, vns.Path(), mtu)
			measure(endpoints{h, "127.0.0.1", v, "10.0.2.2"}, relay{name: "slirp4netns", pid: pid})
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
				missing(t, "gvproxy", "set VMNETCTL_BENCH_GVPROXY or put it on PATH (go install github.com/containers/gvisor-tap-vsock/cmd/gvproxy@latest)")
			}
			h, v := netns(t, "gb-host"), netns(t, "gb-vm")
			if qlen > 0 {
				testutil.Run(t, "ip", "netns", "exec", h, "sysctl", "-qw", fmt.Sprintf("net.unix.max_dgram_qlen=%d", qlen))
			}
			sock, pid := startGvproxy(t, gv, h)
			fd := vfkitClient(t, sock)
			vm := startHelper(t, bin, dir, fd, v, "vmside", "192.168.127.2", nil)
			vm.name = "vm helper"
			measure(endpoints{h, "127.0.0.1", v, "192.168.127.254"}, relay{name: "gvproxy", pid: pid}, vm)
		})
	}

	// The table for docs/performance.md.
	base := map[string]float64{}
	for _, r := range results {
		if r.name == "veth" {
			base[r.dir] = r.gbps
		}
	}
	fmt.Printf("\nload average before: %s, after: %s; %d CPUs; %s\n", loadBefore, loadavg(), runtime.NumCPU(), time.Since(began).Round(time.Second))
	fmt.Printf("\n| path | direction | Gbit/s | vs veth | relays' CPU s/GB | per process | helpers' drops |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		if r.err != "" {
			fmt.Printf("| %s | - | - | - | - | %s | - |\n", r.name, r.err)
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
		fmt.Printf("| %s | %s | %.2f | %s | %s | %s | %s |\n", r.name, r.dir, r.gbps, ratio, cpu, detail, drops)
	}
}

// endpoints says where iperf3's server listens (namespace and address) and
// what the client in the VM namespace connects to.
type endpoints struct {
	hostNS, listen, vmNS, target string
}

// relay is a process that moves the frames, whose CPU time is counted.
type relay struct {
	name string
	pid  int
	// drops, for a helper, is the frames it dropped so far (both
	// directions), from its latest stats line; statsLines counts those
	// lines.
	drops, statsLines func() int64
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

// socketpair is the VMM's socketpair with vmnet-helper's buffer sizes,
// unless VMNETCTL_BENCH_SNDBUF says otherwise.
func socketpair(t *testing.T, tso bool) [2]int {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		setBuffers(fd, tso)
	}
	return fds
}

func setBuffers(fd int, tso bool) {
	rcv := 4 << 20
	if tso {
		rcv = 8 << 20
	}
	snd := 65 * 1024
	if v, err := strconv.Atoi(os.Getenv("VMNETCTL_BENCH_SNDBUF")); err == nil {
		snd = v
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, snd)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcv)
}

// startHelper puts a bridge named for network id with addr in ns (marked
// as the data plane marks it), and a helper on fd with its TAP on that
// bridge. It returns the helper's pid.
func startHelper(t *testing.T, bin, dir string, fd int, ns, id, addr string, extra []string) relay {
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
	testutil.Run(t, "ip", "-n", ns, "link", "add", br, "type", "bridge")
	testutil.Run(t, "ip", "-n", ns, "link", "set", br, "alias", "vmnetctl:network="+id)
	testutil.Run(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", br)
	testutil.Run(t, "ip", "-n", ns, "link", "set", br, "up")
	f := os.NewFile(uintptr(fd), "sock")
	defer f.Close()
	args := append([]string{"netns", "exec", ns, bin, "--networks", cfg, "helper", "--fd", "3", "--network", id, "--tap", "tap0", "--stats-interval", strconv.FormatFloat(statsInterval.Seconds(), 'f', -1, 64)}, extra...)
	cmd := exec.Command("ip", args...)
	cmd.ExtraFiles = []*os.File{f}
	var mu sync.Mutex
	var drops, lines int64
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		// The periodic stats lines only feed the drop counts; the rest,
		// and the last stats line, go to stderr.
		sc := bufio.NewScanner(stderr)
		last := ""
		for sc.Scan() {
			line := sc.Text()
			i := strings.Index(line, "[stats] ")
			if i < 0 {
				fmt.Fprintln(os.Stderr, line)
				continue
			}
			last = line
			var st struct{ Host, VM struct{ Drops int64 } }
			if json.Unmarshal([]byte(line[i+len("[stats] "):]), &st) == nil {
				mu.Lock()
				drops = st.Host.Drops + st.VM.Drops
				lines++
				mu.Unlock()
			}
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
	return relay{pid: cmd.Process.Pid, drops: func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return drops
	}, statsLines: func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return lines
	}}
}

// statsInterval is how often the helpers log their counters, so the drops
// of each direction can be told apart.
const statsInterval = 250 * time.Millisecond

// awaitStats waits until every helper among relays has written two more
// stats lines: the counters then include every frame of the run that just
// ended (the first may have been written while its last frames were still
// in flight).
func awaitStats(t *testing.T, relays []relay) {
	t.Helper()
	for _, r := range relays {
		if r.statsLines == nil {
			continue
		}
		want := r.statsLines() + 2
		testutil.Eventually(t, 20*statsInterval, func() bool { return r.statsLines() >= want }, "two more stats lines from %s", r.name)
	}
}

// dropped is the frames the relays dropped so far.
func dropped(relays []relay) (n int64, known bool) {
	for _, r := range relays {
		if r.drops != nil {
			n += r.drops()
			known = true
		}
	}
	return n, known
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

// gvproxyPath finds gvproxy: $VMNETCTL_BENCH_GVPROXY, PATH, or where
// podman's packages put it.
func gvproxyPath() string {
	if p := os.Getenv("VMNETCTL_BENCH_GVPROXY"); p != "" {
		return p
	}
	if p, err := exec.LookPath("gvproxy"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/libexec/podman/gvproxy", "/usr/lib/podman/gvproxy"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
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
// Buffers as vmnet-helper sets them (non-offloaded).
func vfkitClient(t *testing.T, server string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	setBuffers(fd, false)
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

// iperf runs iperf3 for a few seconds and returns the receiver's Gbit/s
// and bytes.
func iperf(t *testing.T, e endpoints, reverse bool) (float64, int64) {
	t.Helper()
	srv := exec.Command("ip", "netns", "exec", e.hostNS, "iperf3", "-s", "-1", "-B", e.listen)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// A one-off server sometimes outlives a failed client attempt.
	defer func() { srv.Process.Kill(); srv.Wait() }()
	args := []string{"netns", "exec", e.vmNS, "iperf3", "-c", e.target, "-t", strconv.Itoa(seconds), "-J"}
	if reverse {
		args = append(args, "-R")
	}
	// The client is retried until the server listens (it is a one-off
	// server started just now).
	var out []byte
	testutil.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), (seconds+20)*time.Second)
		defer cancel()
		var err error
		out, err = exec.CommandContext(ctx, "ip", args...).Output()
		if err == nil && bytes.Contains(out, []byte(`"error":`)) {
			err = errors.New("iperf3 failed")
		}
		if err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
		return nil
	}, "iperf3 %v", args)
	var res struct {
		End struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3: %v\n%s", err, out)
	}
	if res.End.SumReceived.BitsPerSecond == 0 {
		t.Logf("iperf3 reported nothing received:\n%s", out)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, res.End.SumReceived.Bytes
}
