package controller

import (
	"bufio"
	"compress/gzip"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/metrics"
	"github.com/vmnetctl/vmnetctl/spec"
)

// maxScrapes is how many scrapes are collected at once: room for two
// Prometheus servers and a person with curl.
const maxScrapes = 4

// metricsHandler serves /metrics and /healthz on the metrics address.
//
// The controller's own process metrics (go_*, process_*) come from
// client_golang's collectors, in a registry of the controller's own: nothing
// registered globally by a library can leak into it, and two controllers in
// one process (tests) do not collide. The vmnetctl_* families are written
// by the scrape itself in the text format (scrape.write): at 10,000 VMs
// they are 180,000 series, which client_golang would build whole as
// objects and sort before it wrote a byte (250 MB of allocations a
// scrape); written as they are read, a scrape allocates a few MB.
func (c *Controller) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// A few scrapes at a time collect (each takes the controller's lock
	// and reads the kernel); more are refused at once (503), so that any
	// local process hammering the port cannot queue work in front of the
	// reconciles.
	scrapes := make(chan struct{}, maxScrapes)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		select {
		case scrapes <- struct{}{}:
			defer func() { <-scrapes }()
		default:
			http.Error(w, "vmnetctl: too many scrapes at once", http.StatusServiceUnavailable)
			return
		}
		c.serveMetrics(w, r, reg)
	})
	mux.HandleFunc("GET /healthz", c.healthz)
	return mux
}

// serveMetrics writes reg's families and the controller's in the text
// format, gzipped when the scraper accepts it (Prometheus does).
func (c *Controller) serveMetrics(w http.ResponseWriter, r *http.Request, reg prometheus.Gatherer) {
	s := c.readScrape()
	mfs, err := reg.Gather()
	if err != nil {
		http.Error(w, "vmnetctl: gathering the controller's process metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		// The fastest level: the text repeats itself (a 17 MB scrape
		// of 10,000 VMs is 0.66 MB at it, 0.57 MB at the default
		// level, which took 45% longer), and the time is the controller's.
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer gz.Close()
		out = gz
	}
	bw := bufio.NewWriterSize(out, 32<<10)
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(bw, mf); err != nil {
			return // the scraper went away
		}
	}
	s.write(bw)
	bw.Flush()
}

// acceptsGzip says whether an Accept-Encoding header takes gzip.
func acceptsGzip(header string) bool {
	for _, e := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(e, ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			q := strings.ReplaceAll(params, " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

// family is one of the controller's metric families, written by a scrape
// in the Prometheus text format.
type family struct {
	name, help string
	counter    bool
	labels     []string // the variable labels, in the order their values are given
	order      []int    // labels' indices in name order, as they are written
}

// newFamily is a family of the variable labels given, in that order,
// written in name order, as client_golang writes them (what scripts and
// dashboards match): the one place a family's order is derived.
func newFamily(name string, counter bool, help string, labels ...string) *family {
	f := &family{name: name, help: help, counter: counter, labels: labels, order: make([]int, len(labels))}
	for i := range f.order {
		f.order[i] = i
	}
	slices.SortFunc(f.order, func(a, b int) int { return strings.Compare(f.labels[a], f.labels[b]) })
	return f
}

// The labels of the per-attachment metrics: network and VM name, and the
// attachment's position in the VM's list of networks. VM names are unique
// across projects, so these identify an attachment; PIDs and MACs are left
// out so that a restarted helper or an edited MAC continues the series.
var attachmentLabels = []string{"network", "vm", "index"}

func attachmentFamily(name string, counter bool, help string, extra ...string) *family {
	return newFamily(name, counter, help, append(slices.Clone(attachmentLabels), extra...)...)
}

func networkFamily(name string, counter bool, help string, extra ...string) *family {
	return newFamily(name, counter, help, append([]string{"network"}, extra...)...)
}

const (
	counter = true
	gauge   = false
)

var (
	famAttachmentInfo = attachmentFamily("vmnetctl_attachment_info", gauge,
		"An attachment of a VM to a network (always 1), with its project and kind (socket or tap).", "project", "attach")
	famBytes = attachmentFamily("vmnetctl_attachment_bytes_total", counter,
		"Bytes of Ethernet frames the attachment's helper forwarded, to the VM (to_vm) or from it (from_vm). Starts again at 0 when the helper restarts.", "direction")
	famPackets = attachmentFamily("vmnetctl_attachment_packets_total", counter,
		"Ethernet frames the attachment's helper forwarded, by direction. Starts again at 0 when the helper restarts.", "direction")
	famDrops = attachmentFamily("vmnetctl_attachment_dropped_packets_total", counter,
		"Frames the attachment's helper dropped (peer too slow, oversized or malformed), by direction. Starts again at 0 when the helper restarts.", "direction")
	famAttachmentEgressDenied = attachmentFamily("vmnetctl_attachment_egress_denied_total", counter,
		"Connections the VM opened that its network's egress policy refused (networks with one).")
	famBandwidthLimit = attachmentFamily("vmnetctl_attachment_bandwidth_limit_bytes_per_second", gauge,
		"The attachment's bandwidth limit in bytes a second, by direction (to_vm, from_vm), for the attachments that have one (Linux enforces it on the VM's port).", "direction")
	famForwardConns = attachmentFamily("vmnetctl_attachment_forward_connections_total", counter,
		"Connections (new flows, for UDP) a port forward of the attachment took, by forward (HOSTIP:PORT -> GUESTPORT/PROTO).", "forward")
	famSpoofDrops = attachmentFamily("vmnetctl_attachment_spoofed_frames_total", counter,
		"Frames from the VM that the anti-spoofing guard dropped: a MAC, IPv4 source or ARP sender not its own, DHCP or router answers, DHCP requests over 20 a second, other protocols (Linux; a run of TCP segments the relay merged counts once).")
	famSyscalls = attachmentFamily("vmnetctl_attachment_forward_syscalls_total", counter,
		"System calls the helper made to forward frames, by direction and path: fast moved a batch of frames, slow one frame.", "direction", "path")
	famStatsTime = attachmentFamily("vmnetctl_attachment_stats_timestamp_seconds", gauge,
		"When the helper last reported its counters, as a Unix time.")
	famHelperUp = attachmentFamily("vmnetctl_helper_up", gauge,
		"Whether the attachment's helper process runs (1) or not (0: starting, in backoff, failed).")
	famRestarts = attachmentFamily("vmnetctl_helper_restarts_total", counter,
		"Times the controller restarted the attachment's helper after it exited.")
	famStartDuration = attachmentFamily("vmnetctl_helper_start_duration_seconds", gauge,
		"How long the running helper took from exec to ready (absent for a helper adopted from a previous controller).")
	famStartTime = attachmentFamily("vmnetctl_helper_start_time_seconds", gauge,
		"When the running helper started, as a Unix time.")
	famCPU = attachmentFamily("vmnetctl_helper_cpu_seconds_total", counter,
		"User and system CPU time of the running helper process (Linux only; at most a minute old while its traffic does not move).")
	famRSS = attachmentFamily("vmnetctl_helper_resident_memory_bytes", gauge,
		"Resident memory of the running helper process (Linux only; at most a minute old while its traffic does not move).")

	famNetworkInfo = networkFamily("vmnetctl_network_info", gauge,
		"A network some attachment uses (always 1), with its mode, subnet and bridge.", "mode", "subnet", "bridge")
	famNetworkUp = networkFamily("vmnetctl_network_up", gauge,
		"Whether the network is up with its services (DHCP, DNS) running in the controller (1) or failed to start (0).")
	famNetworkDegraded = networkFamily("vmnetctl_network_degraded", gauge,
		"1 while the network's kernel state differs from its configuration (changed behind vmnetctl's back) and a repair has not put it back.")
	famNetworkRepairs = networkFamily("vmnetctl_network_repairs_total", counter,
		"Times the controller found the network changed behind its back (a bridge, address or nftables table gone or altered) and repaired it.")
	famNetworkAttachments = networkFamily("vmnetctl_network_attachments", gauge,
		"Attachments of VMs to the network.")
	famLeases = networkFamily("vmnetctl_network_dhcp_leases", gauge,
		"Unexpired DHCP leases of the network.")
	famPool = networkFamily("vmnetctl_network_dhcp_pool_addresses", gauge,
		"Addresses in the network's DHCP range (dhcpStart to dhcpEnd).")
	famDHCPRequests = networkFamily("vmnetctl_network_dhcp_requests_total", counter,
		"DHCP messages the network's server received, by message type.", "type")
	famDHCPReplies = networkFamily("vmnetctl_network_dhcp_replies_total", counter,
		"DHCP messages the network's server sent, by message type.", "type")
	famDHCPErrors = networkFamily("vmnetctl_network_dhcp_errors_total", counter,
		"DHCP messages dropped: unparsable, not for this server, no address left, or a reply that could not be sent.")
	famDHCPSpoofed = networkFamily("vmnetctl_network_dhcp_spoofed_total", counter,
		"DHCP messages ignored because their client hardware address (chaddr) is not the MAC of the frame that carried them (a VM asking for another MAC).")
	famDHCPLimited = networkFamily("vmnetctl_network_dhcp_limited_total", counter,
		"DHCP messages dropped unanswered because their client sent more than its rate (a burst of 10, then 2 a second).")
	famDNSQueries = networkFamily("vmnetctl_network_dns_queries_total", counter,
		"DNS queries the network's proxy received.")
	famDNSResponses = networkFamily("vmnetctl_network_dns_responses_total", counter,
		"DNS queries the network's proxy handled, by outcome: local (a VM's name), nxdomain (an unknown name under vmnet.internal), forwarded (answered upstream), servfail (no upstream answered), refused (not the network's own name, forwarding off), dropped (not answered: too many in flight).", "outcome")

	famTunnelPeers = networkFamily("vmnetctl_network_tunnel_peers", gauge,
		"Hosts a network across hosts floods to from this host (the other entries of its vxlan.hosts).")
	famTunnelMACs = networkFamily("vmnetctl_network_tunnel_remote_macs", gauge,
		"MACs this host's bridge of a network across hosts learned behind its tunnel: the other hosts' VMs it talked to.")
	famTunnelBytes = networkFamily("vmnetctl_network_tunnel_bytes_total", counter,
		"Bytes of a network across hosts that its tunnel sent to (tx) or received from (rx) the other hosts.", "direction")
	famTunnelDropped = networkFamily("vmnetctl_network_tunnel_dropped_total", counter,
		"Frames from the other hosts of a network across hosts that the tunnel's guard kept off this host's side (their gateways' traffic, DHCP, router advertisements).")
	famTunnelBGP = networkFamily("vmnetctl_network_tunnel_bgp_established", gauge,
		"A network across hosts with EVPN: the other hosts whose BGP session with this host's FRR is established.")
	famWireGuardHandshake = networkFamily("vmnetctl_network_wireguard_last_handshake_seconds", gauge,
		"A network across hosts with an encrypted underlay: the Unix time of the last WireGuard handshake with each other host (0: none yet). Older than 3 minutes: the session is down.", "host")
	famWireGuardBytes = networkFamily("vmnetctl_network_wireguard_bytes_total", counter,
		"A network across hosts with an encrypted underlay: encrypted bytes sent to (tx) or received from (rx) each other host.", "host", "direction")
	famEgressDenied = networkFamily("vmnetctl_network_egress_denied_total", counter,
		"Connections the network's VMs opened that its egress policy refused (networks with one).")
	famNeighLimited = networkFamily("vmnetctl_network_neighbour_limited_total", counter,
		"Connections the network's VMs opened that were refused because they would have made the host resolve more next hops than the network may (its share of the host's neighbour table) or faster than a VM port may.")
	famRAs = networkFamily("vmnetctl_network_ipv6_router_advertisements_total", counter,
		"IPv6 router advertisements the network sent (periodic, and in reply to solicitations).")
	famRSs = networkFamily("vmnetctl_network_ipv6_router_solicitations_total", counter,
		"IPv6 router solicitations the network received from VMs, by whether they got a reply of their own (answered) or shared one under the rate limit (limited).", "outcome")
	famIPv6Addrs = networkFamily("vmnetctl_network_ipv6_addresses", gauge,
		"IPv6 addresses (link-local included) the network has bound to its VMs, learned from neighbour discovery.")
	famIPv6Conflicts = networkFamily("vmnetctl_network_ipv6_address_conflicts_total", counter,
		"Claims of an IPv6 address refused: taken (bound to another VM: first come, first served) or limit (past 4096 addresses in the network).", "reason")

	famReconciles = newFamily("vmnetctl_reconciles_total", counter,
		"Reconciles by result (success or error).", "result")
	famReconcileDuration = newFamily("vmnetctl_reconcile_duration_seconds", gauge,
		"How long the latest reconcile took.")
	famReconcilePhase = newFamily("vmnetctl_reconcile_phase_seconds_total", counter,
		"Time the reconciles spent in each of their steps, all together: desired (reading and resolving the projects), stop, repair, networks, names, partitions, forwards, claims, start (the helpers'), bandwidth, ports, commit.", "phase")
	famFullPasses = newFamily("vmnetctl_full_reconciles_total", counter,
		"Full reconciles (the resync, a change seen behind the controller's back, a retry, a reload) by whether they read every VM port again (read) or left them as the last that read them found them, the kernel having said nothing of them since (settled).", "ports")
	famPortNotices = newFamily("vmnetctl_port_notices_total", counter,
		"Notices of the kernel's that may concern the VMs' ports (a vmnetctl link, a port of a vmnetctl bridge, anything in a vmnetctl nftables table), and losses of notices, as the controller's watch read them: while it stands, full reconciles leave the ports unread. Absent without a watch that can tell.")
	famLastSuccess = newFamily("vmnetctl_last_successful_reconcile_timestamp_seconds", gauge,
		"When a reconcile last succeeded, as a Unix time.")
	famBuildInfo = newFamily("vmnetctl_build_info", gauge,
		"The controller's version, commit and Go version (always 1).", "version", "commit", "goversion")
)

// families is every family of the controller's, in the order a scrape
// writes them: the controller's, its networks', then its attachments'
// (attachmentSeries).
var families = append([]*family{
	famBuildInfo, famReconciles, famReconcileDuration, famReconcilePhase, famFullPasses, famPortNotices, famLastSuccess,
	famNetworkInfo, famNetworkAttachments, famNetworkUp, famNetworkDegraded, famNetworkRepairs, famLeases, famPool,
	famDHCPRequests, famDHCPReplies, famDHCPErrors, famDHCPSpoofed, famDHCPLimited, famDNSQueries, famDNSResponses,
	famEgressDenied, famNeighLimited, famTunnelPeers, famTunnelMACs, famTunnelBytes, famTunnelDropped, famTunnelBGP,
	famWireGuardHandshake, famWireGuardBytes, famRAs, famRSs, famIPv6Addrs, famIPv6Conflicts,
}, attachmentFamilies()...)

func attachmentFamilies() []*family {
	var fs []*family
	for _, s := range attachmentSeries {
		fs = append(fs, s.f)
	}
	return fs
}

// The DHCP message types and DNS outcomes are always exported, at 0 until
// they happen, so that rate() over them works from the first scrape.
var (
	dhcpRequestTypes = []string{"DISCOVER", "REQUEST", "RELEASE", "DECLINE", "INFORM", "other"}
	dhcpReplyTypes   = []string{"OFFER", "ACK", "NAK"}
)

// scrape is what one scrape read of the controller's state, under its
// lock once: the controller's and networks' samples as text by family
// (few), and a record of numbers for each attachment, written family by
// family once the lock is let go.
type scrape struct {
	text        map[*family][]byte
	attachments []attachmentSample
}

// attachmentSample is what a scrape read of one attachment and its helper.
type attachmentSample struct {
	network, vm     string
	index           string
	project, attach string
	forwards        []forwardCount
	toVM, fromVM    uint64 // bandwidth limits, bit/s (0: none)
	egress          bool   // an egress policy applies: egressDenied counts
	egressDenied    uint64
	helper, up      bool // a helper is supervised; it runs
	restarts        int
	spoofChecked    bool // its port's guard counts drops: spoofed
	spoofed         uint64
	stats           helperproto.Stats
	startedAt       time.Time
	startLatency    time.Duration
	pid             int
	h               *helperProc     // (a key for procCache only)
	proc            metrics.Process // read once the lock is let go
	procOK          bool
}

type forwardCount struct {
	name  string
	conns uint64
}

// emit adds a sample of f, with its labels' values in f's order.
func (s *scrape) emit(f *family, v float64, values ...string) {
	b := append(s.text[f], f.name...)
	b = appendLabels(b, f, values)
	s.text[f] = appendValue(b, v)
}

// readScrape reads what a scrape serves, under the controller's lock, and
// each running helper's process accounting after it.
func (c *Controller) readScrape() *scrape {
	s := &scrape{text: map[*family][]byte{}}
	s.emit(famBuildInfo, 1, c.opts.Version, BuildCommit(), runtime.Version())

	c.mu.Lock()
	c.watch.Drain()
	for _, result := range []string{"success", "error"} {
		s.emit(famReconciles, float64(c.reconciles[result]), result)
	}
	if c.reconciles["success"]+c.reconciles["error"] > 0 {
		s.emit(famReconcileDuration, c.lastReconcileTime.Seconds())
	}
	s.emit(famFullPasses, float64(c.settle.read), "read")
	s.emit(famFullPasses, float64(c.settle.unread), "settled")
	if c.settle.notices != nil {
		if n, ok := c.settle.notices(); ok {
			s.emit(famPortNotices, float64(n))
		}
	}
	spent := c.progress.spentIn()
	for _, id := range slices.Sorted(maps.Keys(phases)) {
		s.emit(famReconcilePhase, spent[id].Seconds(), id)
	}
	if !c.lastOK.IsZero() {
		s.emit(famLastSuccess, unixSeconds(c.lastOK))
	}
	d := c.applied
	if d == nil {
		d = &spec.Desired{}
	}
	stats := map[string]backend.ServiceStats{}
	for _, n := range d.Networks {
		stats[n.ID] = c.collectNetwork(s, n, d)
	}
	s.attachments = make([]attachmentSample, len(d.Attachments))
	for i, a := range d.Attachments {
		c.collectAttachment(&s.attachments[i], a, stats[a.Network])
	}
	c.mu.Unlock()
	c.procs.read(s.attachments, time.Now())
	return s
}

// procMaxAge is how old the CPU time and resident set a scrape serves of
// a helper whose traffic did not move may be.
const procMaxAge = time.Minute

// procCache keeps each running helper's process accounting as scrapes
// read it. A read of /proc/PID/stat costs about 50 us here (the kernel
// sums the process's threads): at 10,000 helpers, 0.5 s of every scrape.
// A helper whose stats moved is read again at each scrape; an idle one,
// whose figures hardly change, once a procMaxAge.
type procCache struct {
	mu sync.Mutex
	m  map[*helperProc]cachedProc
}

type cachedProc struct {
	p       metrics.Process
	at      time.Time // when read
	statsAt time.Time // the helper's stats' time then
}

// read fills in the running helpers' accounting of a scrape's samples.
func (pc *procCache) read(samples []attachmentSample, now time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	next := make(map[*helperProc]cachedProc, len(pc.m))
	for i := range samples {
		as := &samples[i]
		if !as.up {
			continue
		}
		cp, ok := pc.m[as.h]
		if !ok || now.Sub(cp.at) >= procMaxAge || as.stats.Time.After(cp.statsAt) {
			p, err := metrics.ReadProcess(as.pid)
			if err != nil {
				continue // (gone since: no sample)
			}
			cp = cachedProc{p: p, at: now, statsAt: as.stats.Time}
		}
		as.proc, as.procOK = cp.p, true
		next[as.h] = cp // (the helpers gone are forgotten)
	}
	pc.m = next
}

// collectNetwork emits a network's metrics and its services', and returns
// its services' stats (zero when it does not run).
func (c *Controller) collectNetwork(s *scrape, n *api.Network, d *spec.Desired) backend.ServiceStats {
	subnet := ""
	if n.Subnet.IsValid() {
		subnet = n.Subnet.String()
	}
	s.emit(famNetworkInfo, 1, n.ID, string(n.Mode), subnet, n.Bridge())
	attachments := 0
	for _, a := range d.Attachments {
		if a.Network == n.ID {
			attachments++
		}
	}
	s.emit(famNetworkAttachments, float64(attachments), n.ID)
	nw := c.nets[n.ID]
	s.emit(famNetworkUp, boolFloat(nw != nil), n.ID)
	s.emit(famNetworkDegraded, boolFloat(c.degraded[n.ID] != ""), n.ID)
	s.emit(famNetworkRepairs, float64(c.repairs[n.ID]), n.ID)
	if nw == nil {
		return backend.ServiceStats{}
	}
	st := nw.Stats(backend.StatsQuery{})
	if n.DHCP {
		s.emit(famLeases, float64(len(nw.Leases())), n.ID)
		s.emit(famPool, float64(metrics.PoolSize(n.DHCPStart, n.DHCPEnd)), n.ID)
		for _, t := range withKnown(st.DHCP.Requests, dhcpRequestTypes) {
			s.emit(famDHCPRequests, float64(st.DHCP.Requests[t]), n.ID, strings.ToLower(t))
		}
		for _, t := range withKnown(st.DHCP.Replies, dhcpReplyTypes) {
			s.emit(famDHCPReplies, float64(st.DHCP.Replies[t]), n.ID, strings.ToLower(t))
		}
		s.emit(famDHCPErrors, float64(st.DHCP.Errors), n.ID)
		s.emit(famDHCPSpoofed, float64(st.DHCP.Spoofed), n.ID)
		s.emit(famDHCPLimited, float64(st.DHCP.Limited), n.ID)
	}
	if n.DNSProxy {
		s.emit(famDNSQueries, float64(st.DNS.Queries), n.ID)
		for _, o := range []struct {
			outcome string
			v       uint64
		}{{"local", st.DNS.Local}, {"nxdomain", st.DNS.NXDomain}, {"forwarded", st.DNS.Forwarded}, {"servfail", st.DNS.ForwardErrors},
			{"refused", st.DNS.Refused}, {"dropped", st.DNS.Dropped}} {
			s.emit(famDNSResponses, float64(o.v), n.ID, o.outcome)
		}
	}
	if n.Egress != nil {
		s.emit(famEgressDenied, float64(st.EgressDenied), n.ID)
	}
	if n.Routed() {
		s.emit(famNeighLimited, float64(st.NeighLimited), n.ID)
	}
	if t := st.Tunnel; t != nil {
		s.emit(famTunnelPeers, float64(len(t.Peers)), n.ID)
		s.emit(famTunnelMACs, float64(t.RemoteMACs), n.ID)
		s.emit(famTunnelBytes, float64(t.TxBytes), n.ID, "tx")
		s.emit(famTunnelBytes, float64(t.RxBytes), n.ID, "rx")
		s.emit(famTunnelDropped, float64(t.Dropped), n.ID)
		if t.BGPSessions != nil {
			s.emit(famTunnelBGP, float64(t.BGPEstablished()), n.ID)
		}
		for _, p := range t.WireGuard {
			hs := 0.0
			if !p.LastHandshake.IsZero() {
				hs = float64(p.LastHandshake.Unix())
			}
			s.emit(famWireGuardHandshake, hs, n.ID, p.Host)
			s.emit(famWireGuardBytes, float64(p.TxBytes), n.ID, p.Host, "tx")
			s.emit(famWireGuardBytes, float64(p.RxBytes), n.ID, p.Host, "rx")
		}
	}
	if n.HasIPv6() {
		v6 := st.IPv6
		if n.RouterAdvertisement {
			s.emit(famRAs, float64(v6.RouterAdvertisements), n.ID)
			s.emit(famRSs, float64(v6.Solicitations-v6.SolicitationsLimited), n.ID, "answered")
			s.emit(famRSs, float64(v6.SolicitationsLimited), n.ID, "limited")
		}
		s.emit(famIPv6Addrs, float64(v6.Bindings), n.ID)
		s.emit(famIPv6Conflicts, float64(v6.Conflicts), n.ID, "taken")
		s.emit(famIPv6Conflicts, float64(v6.Refused), n.ID, "limit")
	}
	return st
}

// collectAttachment reads into as what a scrape serves of attachment a and
// its helper; st is its network's services' stats. c.mu is held.
func (c *Controller) collectAttachment(as *attachmentSample, a *spec.Attachment, st backend.ServiceStats) {
	key := a.Key()
	as.network, as.vm, as.index = a.Network, a.VM, strconv.Itoa(a.Index)
	as.project, as.attach = a.Project, string(a.Attach)
	for _, pf := range a.PortForwards {
		as.forwards = append(as.forwards, forwardCount{pf.String(), st.ForwardConns[backend.ForwardKey(key, pf)]})
	}
	if b := a.Bandwidth; b != nil {
		as.toVM, as.fromVM = b.ToVM, b.FromVM
	}
	if n := c.applied.Network(a.Network); a.Egress != nil || (n != nil && n.Egress != nil) {
		as.egress, as.egressDenied = true, st.EgressDeniedByMAC[a.MAC]
	}
	h := c.helpers[key]
	as.up = h != nil && h.state == ctlapi.StateRunning && !isClosed(h.exited)
	if h == nil {
		return
	}
	as.helper, as.restarts = true, h.rec.Restarts
	if st.GuardDrops != nil && h.rec.Tap != "" {
		as.spoofChecked, as.spoofed = true, st.GuardDrops[h.rec.Tap]
	}
	as.stats = c.observeMovedLocked(key, h).Last()
	if as.stats.Time.IsZero() {
		as.stats = h.stats // a stats line without a time still has counters
	}
	as.startedAt, as.startLatency, as.pid, as.h = h.rec.StartedAt, h.startLatency, h.rec.Proc.PID, h
}

// attachmentSeries says, for each per-attachment family, which samples an
// attachment has.
var attachmentSeries = []struct {
	f    *family
	each func(as *attachmentSample, w *sampleWriter)
}{
	{famAttachmentInfo, func(as *attachmentSample, w *sampleWriter) { w.put(1, as.project, as.attach) }},
	{famForwardConns, func(as *attachmentSample, w *sampleWriter) {
		for _, f := range as.forwards {
			w.put(float64(f.conns), f.name)
		}
	}},
	{famBandwidthLimit, func(as *attachmentSample, w *sampleWriter) {
		if as.toVM > 0 {
			w.put(float64(as.toVM)/8, "to_vm")
		}
		if as.fromVM > 0 {
			w.put(float64(as.fromVM)/8, "from_vm")
		}
	}},
	{famAttachmentEgressDenied, func(as *attachmentSample, w *sampleWriter) {
		if as.egress {
			w.put(float64(as.egressDenied))
		}
	}},
	{famHelperUp, func(as *attachmentSample, w *sampleWriter) { w.put(boolFloat(as.up)) }},
	{famRestarts, func(as *attachmentSample, w *sampleWriter) {
		if as.helper {
			w.put(float64(as.restarts))
		}
	}},
	{famSpoofDrops, func(as *attachmentSample, w *sampleWriter) {
		if as.spoofChecked {
			w.put(float64(as.spoofed))
		}
	}},
	{famBytes, byDirection(func(c helperproto.Counters) uint64 { return c.Bytes })},
	{famPackets, byDirection(func(c helperproto.Counters) uint64 { return c.Packets })},
	{famDrops, byDirection(func(c helperproto.Counters) uint64 { return c.Drops })},
	{famSyscalls, func(as *attachmentSample, w *sampleWriter) {
		if as.helper {
			w.put(float64(as.stats.Host.Fast), "to_vm", "fast")
			w.put(float64(as.stats.Host.Slow), "to_vm", "slow")
			w.put(float64(as.stats.VM.Fast), "from_vm", "fast")
			w.put(float64(as.stats.VM.Slow), "from_vm", "slow")
		}
	}},
	{famStatsTime, func(as *attachmentSample, w *sampleWriter) {
		if as.helper && !as.stats.Time.IsZero() {
			w.put(unixSeconds(as.stats.Time))
		}
	}},
	{famStartTime, func(as *attachmentSample, w *sampleWriter) {
		if as.up {
			w.put(unixSeconds(as.startedAt))
		}
	}},
	{famStartDuration, func(as *attachmentSample, w *sampleWriter) {
		if as.up && as.startLatency > 0 {
			w.put(as.startLatency.Seconds())
		}
	}},
	{famCPU, func(as *attachmentSample, w *sampleWriter) {
		if as.procOK {
			w.put(as.proc.CPUSeconds)
		}
	}},
	{famRSS, func(as *attachmentSample, w *sampleWriter) {
		if as.procOK {
			w.put(float64(as.proc.ResidentBytes))
		}
	}},
}

// byDirection is the samples of a helper's traffic counter: to the VM
// (the host's side's count) and from it.
func byDirection(count func(helperproto.Counters) uint64) func(*attachmentSample, *sampleWriter) {
	return func(as *attachmentSample, w *sampleWriter) {
		if as.helper {
			w.put(float64(count(as.stats.Host)), "to_vm")
			w.put(float64(count(as.stats.VM)), "from_vm")
		}
	}
}

// write writes the scrape's families in the text format: the controller's
// and networks' as read, then each attachment family's samples, attachment
// by attachment.
func (s *scrape) write(w *bufio.Writer) {
	for _, f := range families[:len(families)-len(attachmentSeries)] {
		if b := s.text[f]; len(b) > 0 {
			writeHeader(w, f)
			w.Write(b)
		}
	}
	sw := &sampleWriter{w: w}
	for _, series := range attachmentSeries {
		sw.f, sw.started = series.f, false
		for i := range s.attachments {
			sw.as = &s.attachments[i]
			series.each(sw.as, sw)
		}
	}
}

// sampleWriter writes the samples of one attachment family, its header
// before the first.
type sampleWriter struct {
	w       *bufio.Writer
	f       *family
	started bool
	as      *attachmentSample
	buf     []byte
	values  []string
}

// put writes a sample of the current attachment, with the values of the
// family's labels after the attachment's own.
func (sw *sampleWriter) put(v float64, extra ...string) {
	if !sw.started {
		writeHeader(sw.w, sw.f)
		sw.started = true
	}
	sw.values = append(append(sw.values[:0], sw.as.network, sw.as.vm, sw.as.index), extra...)
	b := append(sw.buf[:0], sw.f.name...)
	b = appendLabels(b, sw.f, sw.values)
	sw.buf = appendValue(b, v)
	sw.w.Write(sw.buf)
}

func writeHeader(w *bufio.Writer, f *family) {
	typ := "gauge"
	if f.counter {
		typ = "counter"
	}
	w.WriteString("# HELP " + f.name + " ")
	w.WriteString(helpEscaper.Replace(f.help))
	w.WriteString("\n# TYPE " + f.name + " " + typ + "\n")
}

// appendLabels appends {name="value",...} of f's labels in name order
// (nothing when it has none), the values (in f.labels' order) escaped as
// the text format asks.
func appendLabels(b []byte, f *family, values []string) []byte {
	if len(f.labels) == 0 {
		return b
	}
	b = append(b, '{')
	for k, i := range f.order {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, f.labels[i]...)
		b = append(b, `="`...)
		b = appendEscaped(b, values[i])
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendEscaped appends a label value with backslash, double quote and
// line feed escaped.
func appendEscaped(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch ch := v[i]; ch {
		case '\\', '"':
			b = append(b, '\\', ch)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, ch)
		}
	}
	return b
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// appendValue appends " value\n", the value as client_golang writes it.
func appendValue(b []byte, v float64) []byte {
	b = append(b, ' ')
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '\n')
}

// trafficMeter is what the controller remembers of one helper's stats lines
// between two reads, for rates.
type trafficMeter struct {
	h *helperProc // a new helper starts a new meter: its counters start at 0
	m metrics.Meter
}

// observeLocked reads the stats lines h logged since the last read (for
// the status does) and records each in the
// attachment's meter, so that rates are over the latest stats interval
// however long ago the previous read was. c.mu is held.
func (c *Controller) observeLocked(key string, h *helperProc) *metrics.Meter {
	m := c.meterLocked(key, h)
	readStatsLines(h, m.Add)
	return m
}

// meterLocked is the meter of attachment key's helper h: a new one for a
// new helper. c.mu is held.
func (c *Controller) meterLocked(key string, h *helperProc) *metrics.Meter {
	if c.meters == nil {
		c.meters = map[string]*trafficMeter{}
	}
	tm := c.meters[key]
	if tm == nil || tm.h != h {
		if tm == nil && len(c.meters) >= len(c.helpers) {
			// Some meter is of an attachment gone: the meters are
			// looked through only then (each time a meter was added,
			// 50 million map reads for the first look at 10,000).
			c.pruneMetersLocked()
		}
		tm = &trafficMeter{h: h}
		c.meters[key] = tm
	}
	return &tm.m
}

// observeMovedLocked is observeLocked for a scrape, which asks about
// every helper: one whose log and stats file are as the last log check
// saw them (rotateLogsLocked, which read them after it looked) is not read
// again, its meter being current. A scrape at 10,000 idle helpers read
// 20,000 files (0.6 GB of allocations in two minutes of scrapes every 10
// s); it now stats them.
func (c *Controller) observeMovedLocked(key string, h *helperProc) *metrics.Meter {
	if tm := c.meters[key]; tm != nil && tm.h == h && c.unwrittenSinceCheckLocked(h) {
		return &tm.m
	}
	return c.observeLocked(key, h)
}

// observeForStatusLocked is observeLocked for a status, which must hold
// every stats line a helper wrote before it was asked (c.watch drained
// first): a helper whose files the watch saw unwritten since the log
// check read them is not read again. Where the watch cannot tell, every
// helper is read (a stat can miss a write: filesMoved). A status at
// 10,000 idle helpers read 20,000 files.
func (c *Controller) observeForStatusLocked(key string, h *helperProc) *metrics.Meter {
	if tm := c.meters[key]; tm != nil && tm.h == h && c.inWatchedDir(h) && c.watchSawNoWriteLocked(h) {
		return &tm.m
	}
	return c.observeLocked(key, h)
}

// unwrittenSinceCheckLocked says that h's log and stats file were not
// written since the last log check looked at them: as the controller's
// file watch saw, or, where it cannot tell, as a stat of each says.
func (c *Controller) unwrittenSinceCheckLocked(h *helperProc) bool {
	if c.watchSawNoWriteLocked(h) {
		return true
	}
	return !c.watch.Tells() && h.looked != ([2]fileLook{}) && h.looked == h.lookNow()
}

// pruneMetersLocked forgets the meters of attachments that are gone.
func (c *Controller) pruneMetersLocked() {
	for key, tm := range c.meters {
		if c.helpers[key] != tm.h {
			delete(c.meters, key)
		}
	}
}

// took keeps s as h's latest stats, and passes it to add, if it is newer
// than those.
func (h *helperProc) took(s helperproto.Stats, add func(helperproto.Stats)) {
	if !s.Time.After(h.stats.Time) && !h.stats.Time.IsZero() {
		return // older than what the stats file said (a log's line a minute)
	}
	if s.VM.Packets > h.stats.VM.Packets {
		h.lastFromVM = s.Time
	}
	h.stats = s
	add(s)
}

// rateMaxAge is how old a helper's latest stats line may be for its rates
// to count as current.
func (c *Controller) rateMaxAge() time.Duration {
	return 3*c.opts.StatsInterval + time.Second
}

// readStatsLines reads the helper's latest stats from its stats file
// (--stats-file: our helpers), then the lines h logged since h.statsOff;
// it keeps the latest stats in h.stats and passes every newer one to add.
func readStatsLines(h *helperProc, add func(helperproto.Stats)) {
	if h.logPath == "" {
		return
	}
	take := func(s helperproto.Stats) { h.took(s, add) }
	if s, ok := helperproto.ReadStatsFile(h.statsPath); ok { // (none for vmnet-helper: no path)
		take(s)
	}
	f, err := os.Open(h.logPath)
	if err != nil {
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < h.statsOff {
		h.statsOff = 0 // the log was truncated
	}
	if _, err := f.Seek(h.statsOff, io.SeekStart); err != nil {
		return
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // a partial last line is read again next time
		}
		h.statsOff += int64(len(line))
		if s, ok := helperproto.ParseStatsLine(line); ok {
			take(s)
		} else if _, client, ok := strings.Cut(line, "[main] serving client "); ok {
			h.client, _ = strconv.Unquote(strings.TrimSpace(client))
		} else if _, client, ok := strings.Cut(line, "[main] client "); ok && strings.Contains(client, "is a new socket") {
			q, _, _ := strings.Cut(client, " is a new socket")
			h.client, _ = strconv.Unquote(q)
		} else if sessionStarted(line) {
			h.session = "connected"
		} else if sessionEnded(line) {
			h.session = "VM gone"
		}
	}
}

// withKnown is the keys of m, after the known ones in their order.
func withKnown(m map[string]uint64, known []string) []string {
	keys := append([]string{}, known...)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// buildVersion is the main module's version as the go command stamped it
// (a tag, or a pseudo-version from the VCS), for a controller whose caller
// did not set Options.Version.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "unknown"
}

// BuildCommit is the VCS revision the binary was built from, or "unknown".
func BuildCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// sessionStarted and sessionEnded tell the log lines of a helper whose
// VMM connects to it (a stream's relay, a vhost-user backend) that say a
// VMM came and went.
func sessionStarted(line string) bool {
	return strings.Contains(line, "[main] serving a client on ") || strings.Contains(line, "[vhost-user] a VMM connected")
}

func sessionEnded(line string) bool {
	return strings.Contains(line, "[main] client gone (") || strings.Contains(line, "[vhost-user] the VMM went") ||
		strings.Contains(line, "[vhost-user] the VMM's session ended")
}
