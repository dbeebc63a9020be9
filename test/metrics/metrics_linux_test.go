// Package metrics_test checks the controller's Prometheus metrics end to
// end, as root, inside network namespaces the test creates: the vmnetctl
// binary runs the networks, simulated VMs move known traffic, promtool
// lints what /metrics serves and a real Prometheus server scrapes it.
package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestMain(m *testing.M) { simvm.Main(m) }

// networksYAML's network spans hosts (this host, with its underlay
// address on lo, and one that never answers), with the underlay encrypted,
// so the tunnel's metrics and WireGuard's are served too. HERE is this
// host's WireGuard key (newHost).
const networksYAML = `
vmnet:
  shared:
    subnet: 10.79.0.0/24
    egress:
      deny: [192.0.2.0/24]
    mtu: 1500
    vxlan:
      vni: 79
      underlayMTU: 1610
      wireguard: {subnet: 10.255.79.0/24}
      hosts:
        - {name: here, address: 10.78.79.1, publicKey: "HERE"}
        - {name: there, address: 10.78.79.2, publicKey: "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}
`

const twoVMs = `
vms:
  a:
    networks:
      - vmnet: shared
        portForwards:
          - guestPort: 80
            hostPort: 18080
  b:
    networks:
      - vmnet: shared
  c:
    networks:
      - vmnet: shared
        attach: tap
        bandwidth: {toVM: 10Gbit}
`

// statsInterval is the helpers' stats interval here: short, so that
// counters and rates follow the traffic within a test's patience.
const statsInterval = "200ms"

// metricsAddr is the controller's default address, inside the host namespace.
const metricsAddr = "127.0.0.1:9464"

// host is the machine under test, with an HTTP client that reaches the
// controller's metrics on the namespace's loopback.
type host struct {
	*simvm.Host
	t    *testing.T
	http *http.Client
}

func newHost(t *testing.T) *host {
	h := &host{Host: simvm.NewHost(t, "vmnm", networksYAML, "iperf3", "promtool", "prometheus"), t: t}
	h.MustRun(t, "ip", "addr", "add", "10.78.79.1/32", "dev", "lo")
	key := strings.TrimSpace(h.MustVmnetctl("wireguard", "pubkey"))
	if err := os.WriteFile(h.Networks, []byte(strings.Replace(networksYAML, "HERE", key, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// `up` starts the controller with this environment.
	h.Env = []string{ctlapi.EnvStatsInterval + "=" + statsInterval}
	h.http = h.HTTPClient()
	return h
}

// vmnetctl runs vmnetctl and fails the test on error.
func (h *host) vmnetctl(args ...string) string {
	h.t.Helper()
	return h.MustVmnetctl(args...)
}

func (h *host) get(u string) (string, error) {
	resp, err := h.http.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", u, resp.Status, body)
	}
	return string(body), nil
}

// scrape reads the controller's /metrics.
func (h *host) scrape() (string, samples) {
	h.t.Helper()
	body, err := h.get("http://" + metricsAddr + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	return body, parseSamples(h.t, body)
}

// value is the one sample of name with labels (a subset of its labels),
// or -1 when there is none.
func (h *host) value(name string, labels ...string) float64 {
	h.t.Helper()
	_, s := h.scrape()
	return s.value(h.t, name, labels...)
}

func TestMetrics(t *testing.T) {
	began := time.Now()
	h := newHost(t)
	vms := filepath.Join(h.Dir, "vms.yaml")
	if err := os.WriteFile(vms, []byte(twoVMs), 0o644); err != nil {
		t.Fatal(err)
	}
	h.vmnetctl("up", "-f", vms)
	t.Cleanup(func() { h.vmnetctl("down", "-f", vms) })
	st := h.Status()
	sa, sb := h.Attachment(st, "a"), h.Attachment(st, "b")

	// The endpoint serves, and what it serves passes promtool's linter.
	body, s := h.scrape()
	lint := exec.Command("promtool", "check", "metrics")
	lint.Stdin = strings.NewReader(body)
	if out, err := lint.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	if health, err := h.get("http://" + metricsAddr + "/healthz"); err != nil || health != "ok\n" {
		t.Errorf("/healthz: %q, %v", health, err)
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"vmnetctl_network_info", []string{"network", "shared", "mode", "shared", "subnet", "10.79.0.0/24", "bridge", api.BridgeName("shared")}, 1},
		{"vmnetctl_network_up", []string{"network", "shared"}, 1},
		{"vmnetctl_network_attachments", []string{"network", "shared"}, 3},
		{"vmnetctl_network_dhcp_pool_addresses", []string{"network", "shared"}, -2}, // any
		{"vmnetctl_network_dhcp_leases", []string{"network", "shared"}, 0},
		{"vmnetctl_attachment_info", []string{"vm", "a", "index", "0", "network", "shared", "attach", "socket"}, 1},
		{"vmnetctl_helper_up", []string{"vm", "a"}, 1},
		{"vmnetctl_attachment_info", []string{"vm", "c", "attach", "tap"}, 1},
		{"vmnetctl_helper_up", []string{"vm", "c"}, 1},
		{"vmnetctl_attachment_bandwidth_limit_bytes_per_second", []string{"vm", "c", "direction", "to_vm"}, 10e9 / 8},
		{"vmnetctl_helper_restarts_total", []string{"vm", "b"}, 0},
		{"vmnetctl_reconciles_total", []string{"result", "error"}, 0},
	} {
		got := s.value(t, want.name, want.labels...)
		if got < 0 || want.value >= 0 && got != want.value {
			t.Errorf("%s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}
	for _, name := range []string{"vmnetctl_build_info", "vmnetctl_reconcile_duration_seconds", "vmnetctl_last_successful_reconcile_timestamp_seconds",
		"go_goroutines", "process_resident_memory_bytes"} {
		if !s.has(t, name) {
			t.Errorf("/metrics declares %s but has no sample of it", name)
		}
	}
	for _, name := range []string{"vmnetctl_helper_start_duration_seconds", "vmnetctl_helper_resident_memory_bytes", "vmnetctl_helper_cpu_seconds_total"} {
		if !s.has(t, name, "vm", "a") {
			t.Errorf("/metrics declares %s but has no sample for a's helper", name)
		}
	}
	if s.value(t, "vmnetctl_reconciles_total", "result", "success") < 1 {
		t.Errorf("no successful reconcile counted")
	}
	if rss := s.value(t, "vmnetctl_helper_resident_memory_bytes", "vm", "a"); rss < 1<<20 {
		t.Errorf("helper's resident memory: %v bytes", rss)
	}

	// A lease moves the leases gauge and the DHCP counters.
	a, b := simvm.AttachSocket(t, "vma", sa.MAC, sa.Socket, filepath.Join(h.Dir, "a.client.sock")), simvm.AttachSocket(t, "vmb", sb.MAC, sb.Socket, filepath.Join(h.Dir, "b.client.sock"))
	la, lb := a.DHCP(t), b.DHCP(t)
	testutil.Eventually(t, 5*time.Second, func() error {
		_, s := h.scrape()
		if got := s.value(t, "vmnetctl_network_dhcp_leases", "network", "shared"); got != 2 {
			return fmt.Errorf("leases %v", got)
		}
		if got := s.value(t, "vmnetctl_network_dhcp_replies_total", "network", "shared", "type", "ack"); got < 2 {
			return fmt.Errorf("ACKs %v", got)
		}
		return nil
	}, "two leases to be counted")

	// Every metric is served by now (the helpers have reported): the docs
	// and the dashboard must match what is.
	_, s = h.scrape()
	checkDocumented(t, s)

	// Known traffic: a sends N bytes of TCP payload to b. a's from_vm and
	// b's to_vm counters move by at least N, and not by much more (headers
	// and ACKs only).
	const n = 4 << 20
	// settle is a counter once the helper has reported all traffic so far:
	// from its first stats line written after the call.
	settle := func(vm, dir string) float64 {
		since := float64(time.Now().UnixNano()) / 1e9
		var v float64
		testutil.Eventually(t, 5*time.Second, func() error {
			_, s := h.scrape()
			if stamp := s.value(t, "vmnetctl_attachment_stats_timestamp_seconds", "vm", vm); stamp <= since {
				return fmt.Errorf("latest stats line at %.3f, waiting for one after %.3f", stamp, since)
			}
			v = s.value(t, "vmnetctl_attachment_bytes_total", "vm", vm, "direction", dir)
			return nil
		}, "a new stats line from %s's helper", vm)
		return v
	}
	if err := a.Ping(lb["ip"], 1); err != nil { // ARP: no retries below
		t.Fatal(err)
	}
	fromA0, toB0 := settle("a", "from_vm"), settle("b", "to_vm")
	if got := sendTCP(t, a.NS, b.NS, lb["ip"], n); got != n {
		t.Fatalf("b received %d bytes of %d", got, n)
	}
	fromA, toB := settle("a", "from_vm")-fromA0, settle("b", "to_vm")-toB0
	limit := 1.5*n + 64<<10
	for _, c := range []struct {
		what string
		got  float64
	}{{"a's from_vm bytes", fromA}, {"b's to_vm bytes", toB}} {
		if c.got < n || c.got > limit {
			t.Errorf("%s moved by %.0f for %d bytes of payload (want %d to %.0f)", c.what, c.got, n, n, limit)
		}
	}
	_, after := h.scrape()
	t.Logf("%d bytes of payload: a's from_vm +%.0f, b's to_vm +%.0f; drops: a from_vm %v, b to_vm %v", n, fromA, toB,
		after.value(t, "vmnetctl_attachment_dropped_packets_total", "vm", "a", "direction", "from_vm"),
		after.value(t, "vmnetctl_attachment_dropped_packets_total", "vm", "b", "direction", "to_vm"))
	if p := h.value("vmnetctl_attachment_packets_total", "vm", "a", "direction", "from_vm"); p < n/1500 {
		t.Errorf("a's from_vm packets: %v", p)
	}

	// A real Prometheus scrapes the controller and computes a per-VM rate
	// while traffic flows; status shows the same traffic as current rates.
	prom := startPrometheus(t, h)
	flow := a.Command(context.Background(), "iperf3", "-c", lb["ip"], "-t", "30", "-b", "10M", "-4")
	srv := b.Command(context.Background(), "iperf3", "-s", "-1", "-B", lb["ip"])
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return b.ListeningTCP(5201) }, "the iperf3 server to listen")
	if err := flow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flow.Process.Kill(); flow.Wait(); srv.Process.Kill(); srv.Wait() })
	query := `rate(vmnetctl_attachment_bytes_total{vm="a",direction="from_vm"}[10s])`
	testutil.Eventually(t, 20*time.Second, func() error {
		v, err := prom.query(query)
		if err != nil {
			return err
		}
		if v <= 0 {
			return fmt.Errorf("%s = %v", query, v)
		}
		t.Logf("Prometheus: %s = %.0f bytes/s", query, v)
		return nil
	}, "Prometheus to see a's rate")
	testutil.Eventually(t, 5*time.Second, func() error {
		st := h.Status()
		if a := h.Attachment(st, "a"); a.RxBitsPerSecond < 1e6 {
			return fmt.Errorf("a's rx %v bits/s", a.RxBitsPerSecond)
		}
		if b := h.Attachment(st, "b"); b.TxBitsPerSecond < 1e6 {
			return fmt.Errorf("b's tx %v bits/s", b.TxBitsPerSecond)
		}
		return nil
	}, "status to show a's rate")
	// TCP over the simulated VMs' lossy relays can pause for a
	// retransmission timeout, longer than a stats interval: retry.
	testutil.Eventually(t, 5*time.Second, func() error {
		table := h.vmnetctl("status")
		if !strings.Contains(table, "FROM VM") || !strings.Contains(table, "Mb/s") {
			return fmt.Errorf("no rate in:\n%s", table)
		}
		t.Logf("vmnetctl status while traffic flows:\n%s", table)
		return nil
	}, "the status table to show rates")
	flow.Process.Kill()
	flow.Wait()

	// kill -9 b's helper: the restart counter moves and the helper is up again.
	syscall.Kill(h.Attachment(h.Status(), "b").PID, syscall.SIGKILL)
	testutil.Eventually(t, 10*time.Second, func() error {
		_, s := h.scrape()
		if r := s.value(t, "vmnetctl_helper_restarts_total", "vm", "b"); r != 1 {
			return fmt.Errorf("restarts %v", r)
		}
		if up := s.value(t, "vmnetctl_helper_up", "vm", "b"); up != 1 {
			return fmt.Errorf("up %v", up)
		}
		return nil
	}, "b's restart to be counted")
	testutil.Eventually(t, 10*time.Second, func() error {
		v, err := prom.query(`max(vmnetctl_helper_restarts_total{vm="b"})`)
		if err != nil || v != 1 {
			return fmt.Errorf("restarts %v, %v", v, err)
		}
		return nil
	}, "Prometheus to see the restart")
	if la["ip"] == "" {
		t.Errorf("a has no lease")
	}

	// attach: tap: the helper reports the kernel's TAP counters in the same
	// stats lines. Frames the "VMM" (the test, holding the TAP) writes are
	// what the VM sent.
	sc := h.Attachment(h.Status(), "c")
	const frames, size = 200, 1000
	fromC0 := settle("c", "from_vm")
	writeTapFrames(t, h.NS, sc.Tap, sc.MAC, frames, size)
	if got := settle("c", "from_vm") - fromC0; got < frames*size || got > 1.5*frames*size+64<<10 {
		t.Errorf("c's from_vm bytes moved by %.0f for %d frames of %d bytes written to its TAP", got, frames, size)
	} else {
		t.Logf("TAP attachment: %d frames of %d bytes moved c's from_vm bytes by %.0f", frames, size, got)
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}

// sendTCP sends n bytes over TCP from namespace from to to's addr and
// returns how many the receiver read before the sender's FIN: when it
// returns, every byte went through both helpers. Small socket buffers keep
// few segments in flight, so that the simulated VMs' relays drop (and TCP
// retransmits) little and the counters stay close to the payload.
func sendTCP(t *testing.T, from, to *testutil.NS, addr string, n int) int64 {
	t.Helper()
	var ln net.Listener
	if err := to.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(addr, "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(64 << 10)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		m, _ := io.Copy(io.Discard, c)
		got <- m
	}()
	var c net.Conn
	if err := from.Do(func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetWriteBuffer(64 << 10)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.CopyN(c, zeros{}, int64(n)); err != nil {
		t.Fatalf("sending %d bytes: %v", n, err)
	}
	c.(*net.TCPConn).CloseWrite()
	return <-got
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// writeTapFrames opens the TAP name in ns, as a VMM would, and writes count
// broadcast frames of size bytes from mac to it.
func writeTapFrames(t *testing.T, ns *testutil.NS, name, mac string, count, size int) {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, size)
	copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(frame[6:12], hw)
	frame[12], frame[13] = 0x88, 0xb5 // local experimental EtherType: nobody answers
	err = ns.Do(func() error {
		fd, err := testutil.OpenTAP(name)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for range count {
			if _, err := unix.Write(fd, frame); err != nil {
				return fmt.Errorf("writing to TAP %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkDocumented fails unless docs/metrics.md documents every vmnetctl_
// metric served, and every metric the docs and the Grafana dashboard use
// is served: the docs cannot rot.
func checkDocumented(t *testing.T, served samples) {
	t.Helper()
	names := map[string]bool{}
	// Served only where this test's host cannot be: checked by the test
	// named.
	for name := range servedElsewhere {
		names[name] = true
	}
	for _, s := range served.list {
		if name, ok := served.family(s.name); ok {
			names[name] = true
		} else {
			t.Errorf("/metrics serves %s without a # TYPE line", s.name)
		}
	}
	for _, doc := range []string{"../../docs/metrics.md", "../../docs/grafana-dashboard.json"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		used := map[string]bool{}
		for _, m := range regexp.MustCompile(`\bvmnetctl_[a-z0-9_]*[a-z0-9]\b`).FindAllString(string(data), -1) {
			used[m] = true
			if !names[m] {
				t.Errorf("%s uses %s, which /metrics does not serve", doc, m)
			}
		}
		if strings.HasSuffix(doc, ".md") {
			for name := range names {
				if strings.HasPrefix(name, "vmnetctl_") && !used[name] {
					t.Errorf("%s does not document %s", doc, name)
				}
			}
		}
	}
}

// servedElsewhere are the metrics of a setup TestMetrics does not make,
// and the test that scrapes them there.
var servedElsewhere = map[string]string{
	// EVPN needs an FRR, and does not go with WireGuard, which this
	// test's network has.
	"vmnetctl_network_tunnel_bgp_established": "TestEVPN in test/controller",
}

// prometheus is a Prometheus server the test runs in the host namespace.
type prometheus struct {
	h    *host
	addr string
}

func startPrometheus(t *testing.T, h *host) *prometheus {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: vmnetctl
    static_configs:
      - targets: [%q]
`, metricsAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prometheus{h: h, addr: "127.0.0.1:9090"}
	cmd := h.Command(context.Background(), "prometheus", "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr, "--log.level=warn")
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", log)
		}
	})
	testutil.Eventually(t, 20*time.Second, func() error {
		_, err := h.get("http://" + p.addr + "/-/ready")
		return err
	}, "Prometheus to be ready")
	return p
}

// query runs an instant query and returns its single value (0 for an empty
// result).
func (p *prometheus) query(q string) (float64, error) {
	body, err := p.h.get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		return 0, fmt.Errorf("%s: %w", body, err)
	}
	if resp.Status != "success" {
		return 0, fmt.Errorf("query %s: %s", q, body)
	}
	switch len(resp.Data.Result) {
	case 0:
		return 0, nil
	case 1:
		s, _ := resp.Data.Result[0].Value[1].(string)
		return strconv.ParseFloat(s, 64)
	default:
		return 0, fmt.Errorf("query %s: %d series: %s", q, len(resp.Data.Result), body)
	}
}

// sample is one line of the text exposition format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// samples is a scrape: its samples, and the metric families it declares
// (# TYPE lines, name to type), which exist even without a sample.
type samples struct {
	list     []sample
	families map[string]string
}

// family is the family a sample name belongs to (a histogram's or
// summary's _bucket, _sum and _count samples belong to the base name).
func (ss samples) family(name string) (string, bool) {
	if _, ok := ss.families[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base := strings.TrimSuffix(name, suffix)
		if t := ss.families[base]; base != name && (t == "histogram" || t == "summary") {
			return base, true
		}
	}
	return "", false
}

// value is the value of the one sample of name whose labels include the
// given pairs; -1 when there is none. A name that is no metric family of
// the scrape (misspelled, or not registered) fails the test, so that
// "no sample" always means the family is there without that sample. More
// than one sample fails the test too.
func (ss samples) value(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	if _, ok := ss.family(name); !ok {
		t.Fatalf("/metrics declares no metric family %s (# TYPE)", name)
	}
	found := -1.0
	n := 0
	for _, s := range ss.list {
		if s.matches(name, labels) {
			found = s.value
			n++
		}
	}
	if n > 1 {
		t.Fatalf("%d samples of %s%v", n, name, labels)
	}
	return found
}

// has reports whether the family name (declared, or the test fails) has a
// sample whose labels include the given pairs: a histogram's through its
// _count.
func (ss samples) has(t testing.TB, name string, labels ...string) bool {
	t.Helper()
	if ss.families[name] == "histogram" || ss.families[name] == "summary" {
		name += "_count"
	}
	if _, ok := ss.family(name); !ok {
		t.Fatalf("/metrics declares no metric family %s (# TYPE)", name)
	}
	for _, s := range ss.list {
		if s.matches(name, labels) {
			return true
		}
	}
	return false
}

// matches says whether s is a sample of name whose labels include the
// given pairs.
func (s sample) matches(name string, labels []string) bool {
	if s.name != name {
		return false
	}
	for i := 0; i+1 < len(labels); i += 2 {
		if s.labels[labels[i]] != labels[i+1] {
			return false
		}
	}
	return true
}

// parseSamples parses the text format, which is all promhttp serves
// without content negotiation.
func parseSamples(t testing.TB, body string) samples {
	t.Helper()
	ss := samples{families: map[string]string{}}
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			ss.families[f[2]] = f[3]
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(rest, "{ "); i >= 0 {
			s.name, rest = rest[:i], rest[i:]
		}
		if strings.HasPrefix(rest, "{") {
			rest = rest[1:]
			for !strings.HasPrefix(rest, "}") {
				eq := strings.Index(rest, `="`)
				if eq < 0 {
					t.Fatalf("bad sample line %q", line)
				}
				key := rest[:eq]
				rest = rest[eq+2:]
				var val strings.Builder
				for rest != "" && rest[0] != '"' {
					if rest[0] == '\\' && len(rest) > 1 {
						val.WriteByte(map[byte]byte{'n': '\n', '\\': '\\', '"': '"'}[rest[1]])
						rest = rest[2:]
						continue
					}
					val.WriteByte(rest[0])
					rest = rest[1:]
				}
				s.labels[key] = val.String()
				rest = strings.TrimPrefix(strings.TrimPrefix(rest[1:], ","), " ")
			}
			rest = rest[1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			t.Fatalf("bad sample line %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("bad value in %q: %v", line, err)
		}
		s.value = v
		ss.list = append(ss.list, s)
	}
	return ss
}
