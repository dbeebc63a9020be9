package controller

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/metrics"
	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// metricsController is a controller with one network and two attachments:
// a's helper runs (this test process stands in for it) and has logged two
// stats lines a second apart; b's is in backoff after restarts.
func metricsController(t *testing.T) *Controller {
	t.Helper()
	c, err := New(Options{StateDir: statedir.Dir{Path: t.TempDir()}, StatsInterval: time.Second, Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	n := &api.Network{ID: "shared", Mode: api.ModeShared, Subnet: netip.MustParsePrefix("10.9.0.0/24"),
		DHCPStart: netip.MustParseAddr("10.9.0.2"), DHCPEnd: netip.MustParseAddr("10.9.0.254"), DHCP: true, DNSProxy: true}
	att := func(vm string) *spec.Attachment {
		return &spec.Attachment{Attachment: &api.Attachment{VM: vm, Network: "shared", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}, Project: "p"}
	}
	c.applied = &spec.Desired{Networks: []*api.Network{n}, Attachments: []*spec.Attachment{att("a"), att("b")}}

	now := time.Now()
	log := filepath.Join(t.TempDir(), "a.0.log")
	lines := []string{
		"INFO  [main] serving\n",
		helperproto.FormatStatsLine(helperproto.Stats{Time: now.Add(-time.Second), Host: helperproto.Counters{Bytes: 1000, Packets: 10}, VM: helperproto.Counters{Bytes: 500, Packets: 5}}) + "\n",
		helperproto.FormatStatsLine(helperproto.Stats{Time: now, Host: helperproto.Counters{Bytes: 2000, Packets: 20, Drops: 1, Fast: 3, Slow: 4}, VM: helperproto.Counters{Bytes: 1000, Packets: 10}}) + "\n",
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := procid.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	c.helpers["a/0"] = &helperProc{att: c.applied.Attachments[0], state: ctlapi.StateRunning, exited: make(chan struct{}), logPath: log,
		startLatency: 150 * time.Millisecond,
		rec:          statedir.HelperRecord{Key: "a/0", VM: "a", Network: "shared", Proc: id, StartedAt: now.Add(-time.Minute)}}
	gone := make(chan struct{})
	close(gone)
	c.helpers["b/0"] = &helperProc{att: c.applied.Attachments[1], state: ctlapi.StateBackoff, exited: gone,
		rec: statedir.HelperRecord{Key: "b/0", VM: "b", Network: "shared", Restarts: 3}}
	c.reconciles["success"] = 4
	c.lastReconcileTime = 20 * time.Millisecond
	c.lastOK = now
	return c
}

// gather scrapes c's /metrics as Prometheus does (gzipped), parses what
// it serves, and lints it.
func gather(t *testing.T, c *Controller) map[string]*dto.MetricFamily {
	t.Helper()
	body := scrapeBody(t, c)
	p := expfmt.NewTextParser(model.LegacyValidation)
	byName, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	var mfs []*dto.MetricFamily
	for _, mf := range byName {
		mfs = append(mfs, mf)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	return byName
}

// scrapeBody is what c's /metrics serves a scraper that asks for gzip.
func scrapeBody(t *testing.T, c *Controller) []byte {
	t.Helper()
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.Header.Set("Accept-Encoding", "gzip")
	w := httptest.NewRecorder()
	c.metricsHandler().ServeHTTP(w, r)
	if w.Code != http.StatusOK || w.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("/metrics: %d, encoding %q: %s", w.Code, w.Header().Get("Content-Encoding"), w.Body)
	}
	zr, err := gzip.NewReader(w.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// described maps each of the controller's metric families to its labels.
func described() map[string][]string {
	fams := map[string][]string{}
	for _, f := range families {
		fams[f.name] = f.labels
	}
	return fams
}

// checkFamily fails the test unless name is a described metric family
// with every label named in labels ("k=v" each): without this, a check
// that a sample is absent would pass for a misspelled name or label.
func checkFamily(t *testing.T, families map[string][]string, name string, labels []string) {
	t.Helper()
	have, ok := families[name]
	if !ok {
		t.Fatalf("no metric family %s is described", name)
	}
	for _, kv := range labels {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains(have, k) {
			t.Fatalf("metric family %s has no label %s (labels: %v)", name, k, have)
		}
	}
}

// value finds the sample of name whose labels include want ("k=v" each).
func value(mfs map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
next:
	for _, m := range mfs[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

func TestCollector(t *testing.T) {
	c := metricsController(t)
	mfs := gather(t, c)
	families := described()
	tests := []struct {
		name   string
		labels []string
		want   float64 // -1: the family is described, with these labels, but has no such sample
	}{
		{"vmnetctl_attachment_bytes_total", []string{"vm=a", "index=0", "network=shared", "direction=to_vm"}, 2000},
		{"vmnetctl_attachment_bytes_total", []string{"vm=a", "direction=from_vm"}, 1000},
		{"vmnetctl_attachment_packets_total", []string{"vm=a", "direction=to_vm"}, 20},
		{"vmnetctl_attachment_dropped_packets_total", []string{"vm=a", "direction=to_vm"}, 1},
		{"vmnetctl_attachment_forward_syscalls_total", []string{"vm=a", "direction=to_vm", "path=slow"}, 4},
		{"vmnetctl_attachment_info", []string{"vm=b", "project=p", "attach=socket"}, 1},
		{"vmnetctl_helper_up", []string{"vm=a"}, 1},
		{"vmnetctl_helper_up", []string{"vm=b"}, 0},
		{"vmnetctl_helper_restarts_total", []string{"vm=b"}, 3},
		{"vmnetctl_helper_start_duration_seconds", []string{"vm=a"}, 0.15},
		{"vmnetctl_helper_start_duration_seconds", []string{"vm=b"}, -1},
		{"vmnetctl_helper_cpu_seconds_total", []string{"vm=b"}, -1},
		{"vmnetctl_network_info", []string{"network=shared", "mode=shared", "subnet=10.9.0.0/24", "bridge=" + api.BridgeName("shared")}, 1},
		{"vmnetctl_network_attachments", []string{"network=shared"}, 2},
		{"vmnetctl_network_up", []string{"network=shared"}, 0},
		{"vmnetctl_network_dhcp_leases", nil, -1}, // the network is not up here
		{"vmnetctl_reconciles_total", []string{"result=success"}, 4},
		{"vmnetctl_reconciles_total", []string{"result=error"}, 0},
		{"vmnetctl_reconcile_duration_seconds", nil, 0.02},
		{"vmnetctl_build_info", []string{"version=v1.2.3"}, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.name, tt.labels), func(t *testing.T) {
			checkFamily(t, families, tt.name, tt.labels)
			got, ok := value(mfs, tt.name, tt.labels...)
			if tt.want < 0 {
				if ok {
					t.Errorf("present: %v", got)
				}
				return
			}
			if !ok || got != tt.want {
				t.Errorf("= %v (present %v), want %v", got, ok, tt.want)
			}
		})
	}
	// Labels are written in name order, as client_golang writes them
	// (scripts and dashboards match the lines).
	for _, line := range []string{
		`vmnetctl_attachment_bytes_total{direction="to_vm",index="0",network="shared",vm="a"} 2000`,
		`vmnetctl_attachment_info{attach="socket",index="0",network="shared",project="p",vm="b"} 1`,
		`vmnetctl_attachment_forward_syscalls_total{direction="to_vm",index="0",network="shared",path="slow",vm="a"} 4`,
		`vmnetctl_network_info{bridge="` + api.BridgeName("shared") + `",mode="shared",network="shared",subnet="10.9.0.0/24"} 1`,
		`vmnetctl_build_info{commit="` + BuildCommit() + `",goversion="` + runtime.Version() + `",version="v1.2.3"} 1`,
	} {
		if !bytes.Contains(scrapeBody(t, c), []byte("\n"+line+"\n")) {
			t.Errorf("/metrics has no line %s", line)
		}
	}
	if rss, ok := value(mfs, "vmnetctl_helper_resident_memory_bytes", "vm=a"); !ok || rss < 1<<20 {
		t.Errorf("resident memory of a's helper (this process): %v", rss)
	}
}

func TestStatusRates(t *testing.T) {
	c := metricsController(t)
	st := c.status()
	var a, b ctlapi.AttachmentStatus
	for _, as := range st.Attachments {
		switch as.VM {
		case "a":
			a = as
		case "b":
			b = as
		}
	}
	// 1000 bytes to the VM and 500 from it over the second between the lines.
	if a.TxBitsPerSecond != 8000 || a.RxBitsPerSecond != 4000 || a.TxBytes != 2000 {
		t.Errorf("a: tx %v bit/s, rx %v bit/s, tx %d bytes", a.TxBitsPerSecond, a.RxBitsPerSecond, a.TxBytes)
	}
	if b.TxBitsPerSecond != 0 || b.RxBitsPerSecond != 0 {
		t.Errorf("b, in backoff, has rates: %+v", b)
	}
	var out strings.Builder
	ops.RenderStatus(&out, st)
	if !strings.Contains(out.String(), "FROM VM") || !strings.Contains(out.String(), "4.0 kb/s") || !strings.Contains(out.String(), "8.0 kb/s") {
		t.Errorf("status table:\n%s", out.String())
	}

	// A later read sees only lines written since: the meter keeps the rate
	// between the two latest, and a scrape in between does not disturb it.
	gather(t, c)
	h := c.helpers["a/0"]
	f, err := os.OpenFile(h.logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, helperproto.FormatStatsLine(helperproto.Stats{Time: time.Now().Add(time.Second), Host: helperproto.Counters{Bytes: 2000 + 125000}, VM: helperproto.Counters{Bytes: 1000}}))
	f.Close()
	st = c.status()
	if a := st.Attachments[0]; a.TxBitsPerSecond < 0.9e6 || a.RxBitsPerSecond != 0 {
		t.Errorf("after a third line: tx %v bit/s, rx %v bit/s", a.TxBitsPerSecond, a.RxBitsPerSecond)
	}
}

// TestStatsFromFile: a helper's latest stats come from its stats file
// (--stats-file), even with the end of a longer older line after it; the
// log's stats lines (one a minute) that are older are not taken back, and
// its other lines (the client it serves) are still read.
func TestStatsFromFile(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	line := func(at time.Time, packets uint64) string {
		return helperproto.FormatStatsLine(helperproto.Stats{Time: at, VM: helperproto.Counters{Packets: packets}})
	}
	h := &helperProc{logPath: filepath.Join(dir, "a.0.log"), statsPath: filepath.Join(dir, "a.0.stats")}
	os.WriteFile(h.logPath, []byte(line(t0, 1)+"\nINFO  [main] serving client \"/run/x.sock\"\n"), 0o644)
	os.WriteFile(h.statsPath, []byte(line(t0.Add(5*time.Second), 7)+"\n"+"ts\":1}}\n"), 0o644)
	var added []uint64
	add := func(s helperproto.Stats) { added = append(added, s.VM.Packets) }
	readStatsLines(h, add)
	if h.stats.VM.Packets != 7 || h.client != "/run/x.sock" || !slices.Equal(added, []uint64{7}) {
		t.Errorf("after the first read: stats %+v, client %q, added %v; want the file's 7 only, and the client", h.stats, h.client, added)
	}
	os.WriteFile(h.statsPath, []byte(line(t0.Add(10*time.Second), 9)+"\n"), 0o644)
	readStatsLines(h, add)
	if h.stats.VM.Packets != 9 || !slices.Equal(added, []uint64{7, 9}) || !h.lastFromVM.Equal(t0.Add(10*time.Second)) {
		t.Errorf("after the file changed: stats %+v, added %v, last from the VM %v", h.stats, added, h.lastFromVM)
	}
}

// TestTextEscapes: a label value with a backslash, a double quote or a
// line feed (a project's name, a forward's) reads back as it was, and a
// help text with them keeps its sample parseable.
func TestTextEscapes(t *testing.T) {
	f := newFamily("vmnetctl_test_total", counter, "Odd \\ help\nover lines.", "project")
	odd := "a\\b\"c\nd"
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	s := &scrape{text: map[*family][]byte{}}
	s.emit(f, 3, odd)
	writeHeader(w, f)
	w.Write(s.text[f])
	w.Flush()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(&b)
	if err != nil {
		t.Fatal(err)
	}
	m := mfs[f.name].GetMetric()
	if len(m) != 1 || m[0].GetLabel()[0].GetValue() != odd || m[0].GetCounter().GetValue() != 3 || mfs[f.name].GetHelp() != f.help {
		t.Errorf("read back: %v", mfs[f.name])
	}
}

// TestHelperProcessCached: a scrape serves an idle helper's CPU time as
// read within procMaxAge, and reads it again once the helper's stats move.
func TestHelperProcessCached(t *testing.T) {
	c := metricsController(t)
	cpu := func() float64 {
		t.Helper()
		v, ok := value(gather(t, c), "vmnetctl_helper_cpu_seconds_total", "vm=a")
		if !ok {
			t.Fatal("no CPU time for a's helper (this process)")
		}
		return v
	}
	first := cpu()
	// This process (a's helper here) uses two ticks of CPU more.
	for deadline := time.Now().Add(time.Minute); ; {
		p, err := metrics.ReadProcess(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if p.CPUSeconds >= first+0.02 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("this process's CPU time stayed at %v", p.CPUSeconds)
		}
	}
	if got := cpu(); got != first {
		t.Errorf("an idle helper's CPU time was read again within %v: %v, then %v", procMaxAge, first, got)
	}
	h := c.helpers["a/0"]
	f, err := os.OpenFile(h.logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, helperproto.FormatStatsLine(helperproto.Stats{Time: time.Now().Add(2 * time.Second), Host: helperproto.Counters{Bytes: 3000}}))
	f.Close()
	if got := cpu(); got < first+0.02 {
		t.Errorf("after the helper's stats moved: CPU time %v, want it read again (at least %v)", got, first+0.02)
	}
}
