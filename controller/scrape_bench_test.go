package controller

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// fleetController is a controller of n running attachments on one
// network, each helper (this process stands in for all) with a log and a
// stats file in the helpers' directory that the log check has read.
func fleetController(tb testing.TB, n int) *Controller {
	tb.Helper()
	dir := tb.TempDir()
	c, err := New(Options{StateDir: statedir.Dir{Path: dir}, StatsInterval: time.Second, Version: "v1.2.3"})
	if err != nil {
		tb.Fatal(err)
	}
	net := &api.Network{ID: "fleet", Mode: api.ModeShared, Subnet: netip.MustParsePrefix("10.96.0.0/16"), DHCP: true, DNSProxy: true}
	d := &spec.Desired{Networks: []*api.Network{net}}
	id, err := procid.Read(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	if err := os.MkdirAll(c.sd.HelpersDir(), 0o750); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		vm := fmt.Sprintf("c%05d", i)
		a := &spec.Attachment{Attachment: &api.Attachment{VM: vm, Network: "fleet", MAC: "52:55:55:00:00:01", Attach: api.AttachSocket}, Project: "fleet"}
		d.Attachments = append(d.Attachments, a)
		h := &helperProc{att: a, state: ctlapi.StateRunning, exited: make(chan struct{}),
			logPath: c.sd.HelperLogFile(a.Key()), statsPath: c.sd.HelperStatsFile(a.Key()), startLatency: 12 * time.Millisecond,
			rec: statedir.HelperRecord{Key: a.Key(), VM: vm, Network: "fleet", Proc: id, StartedAt: now.Add(-time.Minute)}}
		s := helperproto.Stats{Time: now, Host: helperproto.Counters{Bytes: uint64(i) * 1000, Packets: uint64(i)}, VM: helperproto.Counters{Bytes: 500, Packets: 5}}
		if err := os.WriteFile(h.statsPath, []byte(helperproto.FormatStatsLine(s)+"\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(h.logPath, []byte("INFO  [main] serving\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
		c.helpers[a.Key()] = h
	}
	c.applied = d
	c.rotateLogsLocked()
	return c
}

// discard is a ResponseWriter that keeps only the size of the body.
type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { d.n += len(b); return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkScrapeFleet serves /metrics of a controller of 1,000 and of
// 10,000 running attachments, with and without gzip: its time and
// allocations are what a Prometheus server's scrape costs the controller.
func BenchmarkScrapeFleet(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		c := fleetController(b, n)
		h := c.metricsHandler()
		for _, enc := range []string{"identity", "gzip"} {
			b.Run(fmt.Sprintf("%d/%s", n, enc), func(b *testing.B) {
				b.ReportAllocs()
				var size int
				for b.Loop() {
					r := httptest.NewRequest("GET", "/metrics", nil)
					r.Header.Set("Accept-Encoding", enc)
					w := &discard{h: http.Header{}}
					h.ServeHTTP(w, r)
					size = w.n
				}
				b.ReportMetric(float64(size), "bytes/scrape")
			})
		}
	}
}

// BenchmarkLogCheckFleet runs the periodic check of the helpers' logs of
// a controller of 10,000 idle attachments (nothing written since the last
// check): with the helpers' directory watched, no helper's file is
// looked at; without the watch, each helper's two files are stat'ed.
func BenchmarkLogCheckFleet(b *testing.B) {
	c := fleetController(b, 10000)
	for _, watched := range []bool{true, false} {
		b.Run(fmt.Sprintf("watched=%v", watched), func(b *testing.B) {
			w := c.watch
			if !watched {
				c.watch = nil
			}
			b.ReportAllocs()
			for b.Loop() {
				c.rotateLogsLocked()
			}
			c.watch = w
		})
	}
}
