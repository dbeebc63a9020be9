package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
)

// The path through the helper:
//
//	host ns: bridge vmn-shared 192.168.105.1 ── TAP ── helper (--fd 3)
//	                                                      │ socketpair
//	vm ns:   bridge vmn-vmside 192.168.105.2 ── TAP ── helper (--fd 3)
//
// The VM side is a second helper playing the VMM (as qemu -netdev dgram
// would), so a frame crosses two relays and two TAPs. The baseline is a veth
// pair between two namespaces with the same addresses. iperf3 runs in the
// namespaces: server on .1, client on .2; "vm→host" is the client sending,
// "host→vm" is -R.

const seconds = 5

func TestThroughput(t *testing.T) {
	if os.Getenv("VMNETCTL_BENCH") == "" {
		t.Skip("set VMNETCTL_BENCH=1 to run the benchmark")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("needs iperf3")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmnetctl")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/vmnetctl/vmnetctl/cmd/vmnetctl").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	type result struct {
		name, dir string
		gbps      float64
		cpuPerGB  float64 // CPU seconds of the helpers per GB moved
	}
	var results []result
	// measure runs iperf3 both ways; pids are the helpers, whose CPU time
	// per GB is a measure the machine's other load disturbs less than
	// throughput.
	measure := func(name, hostNS, vmNS string, pids ...int) {
		for _, reverse := range []bool{false, true} {
			dir := "vm→host"
			if reverse {
				dir = "host→vm"
			}
			before := cpuTime(t, pids)
			g, bytes := iperf(t, hostNS, vmNS, reverse)
			cpu := (cpuTime(t, pids) - before) / (float64(bytes) / 1e9)
			results = append(results, result{name, dir, g, cpu})
			t.Logf("%-22s %s %6.2f Gbit/s, helpers' CPU %.2f s/GB", name, dir, g, cpu)
		}
	}

	// Baseline: veth.
	{
		h, v := netns(t, "vb-host"), netns(t, "vb-vm")
		run(t, "ip", "-n", h, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", v)
		run(t, "ip", "-n", h, "addr", "add", "192.168.105.1/24", "dev", "eth0")
		run(t, "ip", "-n", v, "addr", "add", "192.168.105.2/24", "dev", "eth0")
		run(t, "ip", "-n", h, "link", "set", "eth0", "up")
		run(t, "ip", "-n", v, "link", "set", "eth0", "up")
		measure("veth", h, v)
	}

	for _, tso := range []bool{false, true} {
		name := "helper"
		var extra []string
		if tso {
			name, extra = "helper --enable-tso", []string{"--enable-tso"}
		}
		h, v := netns(t, "hb-host"), netns(t, "hb-vm")
		// One networks.yaml per side: the two are one subnet seen from
		// two namespaces.
		cfg := map[string]string{}
		for _, id := range []string{"shared", "vmside"} {
			gw := map[string]string{"shared": "192.168.105.1", "vmside": "192.168.105.2"}[id]
			cfg[id] = filepath.Join(dir, id+".yaml")
			os.WriteFile(cfg[id], []byte("networks:\n  "+id+": {mode: shared, gateway: "+gw+", dhcpEnd: 192.168.105.254, netmask: 255.255.255.0}\n"), 0o644)
		}
		for _, b := range []struct{ ns, id, addr string }{{h, "shared", "192.168.105.1"}, {v, "vmside", "192.168.105.2"}} {
			br := api.BridgeName(b.id)
			run(t, "ip", "-n", b.ns, "link", "add", br, "type", "bridge")
			run(t, "ip", "-n", b.ns, "link", "set", br, "alias", "vmnetctl:network="+b.id)
			run(t, "ip", "-n", b.ns, "addr", "add", b.addr+"/24", "dev", br)
			run(t, "ip", "-n", b.ns, "link", "set", br, "up")
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		rcv := 4 << 20
		if tso {
			rcv = 8 << 20
		}
		// vmnet-helper's sizes, unless VMNETCTL_BENCH_SNDBUF says otherwise.
		snd := 65 * 1024
		if v, err := strconv.Atoi(os.Getenv("VMNETCTL_BENCH_SNDBUF")); err == nil {
			snd = v
		}
		for _, fd := range fds {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, snd)
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcv)
		}
		var pids []int
		for i, s := range []struct{ ns, id string }{{h, "shared"}, {v, "vmside"}} {
			f := os.NewFile(uintptr(fds[i]), "sock")
			args := append([]string{"netns", "exec", s.ns, bin, "--networks", cfg[s.id], "helper", "--fd", "3", "--network", s.id, "--tap", "tap0"}, extra...)
			pids = append(pids, startHelper(t, f, args))
			f.Close()
		}
		measure(name, h, v, pids...)
	}

	// The table for docs/performance.md.
	base := map[string]float64{}
	for _, r := range results {
		if r.name == "veth" {
			base[r.dir] = r.gbps
		}
	}
	fmt.Printf("\n| path | direction | Gbit/s | vs veth | helpers' CPU s/GB |\n|---|---|---|---|---|\n")
	for _, r := range results {
		cpu := "-"
		if r.name != "veth" {
			cpu = fmt.Sprintf("%.2f", r.cpuPerGB)
		}
		fmt.Printf("| %s | %s | %.2f | %.0f%% | %s |\n", r.name, r.dir, r.gbps, 100*r.gbps/base[r.dir], cpu)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

var seq int

func netns(t *testing.T, prefix string) string {
	seq++
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// cpuTime is the user+system CPU seconds of the processes.
func cpuTime(t *testing.T, pids []int) float64 {
	var total float64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// Fields after the command name (which may hold spaces): utime and
		// stime are the 14th and 15th fields of the line.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		total += (ut + st) / 100 // USER_HZ
	}
	return total
}

func startHelper(t *testing.T, sock *os.File, args []string) int {
	t.Helper()
	cmd := exec.Command("ip", args...)
	cmd.ExtraFiles = []*os.File{sock}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
	})
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
	return cmd.Process.Pid
}

// iperf runs iperf3 for a few seconds and returns the receiver's Gbit/s
// and bytes.
func iperf(t *testing.T, hostNS, vmNS string, reverse bool) (float64, int64) {
	t.Helper()
	srv := exec.Command("ip", "netns", "exec", hostNS, "iperf3", "-s", "-1", "-B", "192.168.105.1")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// A one-off server sometimes outlives a failed client attempt.
	defer func() { srv.Process.Kill(); srv.Wait() }()
	args := []string{"netns", "exec", vmNS, "iperf3", "-c", "192.168.105.1", "-t", strconv.Itoa(seconds), "-J"}
	if reverse {
		args = append(args, "-R")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), (seconds+20)*time.Second)
		out, err := exec.CommandContext(ctx, "ip", args...).Output()
		cancel()
		if err == nil && bytes.Contains(out, []byte(`"error":`)) {
			err = errors.New("iperf3 failed")
		}
		if err == nil {
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
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 %v: %v\n%s", args, err, out)
		}
		time.Sleep(50 * time.Millisecond) // polling for the server to listen
	}
}
