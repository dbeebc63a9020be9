package controller

import (
	"bufio"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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

// metricsHandler serves /metrics and /healthz on the metrics address. The
// registry is the controller's own: nothing registered globally by a
// library can leak into it, and two controllers in one process (tests) do
// not collide.
func (c *Controller) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{c: c},
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		Registry: reg, // promhttp_metric_handler_errors_total
		// A scrape that waits behind a long reconcile (a helper that is slow
		// to start holds the lock) gives up rather than piling up.
		Timeout: 30 * time.Second,
		// A few scrapes at a time collect (each takes the controller's lock
		// and reads the kernel); more are refused at once (503), so that
		// any local process hammering the port cannot queue work in front
		// of the reconciles.
		MaxRequestsInFlight: maxScrapes,
	}))
	mux.HandleFunc("GET /healthz", c.healthz)
	return mux
}

// The labels of the per-attachment metrics: network and VM name, and the
// attachment's position in the VM's list of networks. VM names are unique
// across projects, so these identify an attachment; PIDs and MACs are left
// out so that a restarted helper or an edited MAC continues the series.
var attachmentLabels = []string{"network", "vm", "index"}

func attachmentDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(append([]string{}, attachmentLabels...), extra...), nil)
}

func networkDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"network"}, extra...), nil)
}

var (
	descAttachmentInfo = attachmentDesc("vmnetctl_attachment_info",
		"An attachment of a VM to a network (always 1), with its project and kind (socket or tap).", "project", "attach")
	descBytes = attachmentDesc("vmnetctl_attachment_bytes_total",
		"Bytes of Ethernet frames the attachment's helper forwarded, to the VM (to_vm) or from it (from_vm). Starts again at 0 when the helper restarts.", "direction")
	descPackets = attachmentDesc("vmnetctl_attachment_packets_total",
		"Ethernet frames the attachment's helper forwarded, by direction. Starts again at 0 when the helper restarts.", "direction")
	descDrops = attachmentDesc("vmnetctl_attachment_dropped_packets_total",
		"Frames the attachment's helper dropped (peer too slow, oversized or malformed), by direction. Starts again at 0 when the helper restarts.", "direction")
	descAttachmentEgressDenied = attachmentDesc("vmnetctl_attachment_egress_denied_total",
		"Connections the VM opened that its network's egress policy refused (networks with one).")
	descBandwidthLimit = attachmentDesc("vmnetctl_attachment_bandwidth_limit_bytes_per_second",
		"The attachment's bandwidth limit in bytes a second, by direction (to_vm, from_vm), for the attachments that have one (Linux enforces it on the VM's port).", "direction")
	descForwardConns = attachmentDesc("vmnetctl_attachment_forward_connections_total",
		"Connections (new flows, for UDP) a port forward of the attachment took, by forward (HOSTIP:PORT -> GUESTPORT/PROTO).", "forward")
	descSpoofDrops = attachmentDesc("vmnetctl_attachment_spoofed_frames_total",
		"Frames from the VM that the anti-spoofing guard dropped: a MAC, IPv4 source or ARP sender not its own, DHCP or router answers, DHCP requests over 20 a second, other protocols (Linux; a run of TCP segments the relay merged counts once).")
	descSyscalls = attachmentDesc("vmnetctl_attachment_forward_syscalls_total",
		"System calls the helper made to forward frames, by direction and path: fast moved a batch of frames, slow one frame.", "direction", "path")
	descStatsTime = attachmentDesc("vmnetctl_attachment_stats_timestamp_seconds",
		"When the helper last reported its counters, as a Unix time.")
	descHelperUp = attachmentDesc("vmnetctl_helper_up",
		"Whether the attachment's helper process runs (1) or not (0: starting, in backoff, failed).")
	descRestarts = attachmentDesc("vmnetctl_helper_restarts_total",
		"Times the controller restarted the attachment's helper after it exited.")
	descStartDuration = attachmentDesc("vmnetctl_helper_start_duration_seconds",
		"How long the running helper took from exec to ready (absent for a helper adopted from a previous controller).")
	descStartTime = attachmentDesc("vmnetctl_helper_start_time_seconds",
		"When the running helper started, as a Unix time.")
	descCPU = attachmentDesc("vmnetctl_helper_cpu_seconds_total",
		"User and system CPU time of the running helper process (Linux only).")
	descRSS = attachmentDesc("vmnetctl_helper_resident_memory_bytes",
		"Resident memory of the running helper process (Linux only).")

	descNetworkInfo = networkDesc("vmnetctl_network_info",
		"A network some attachment uses (always 1), with its mode, subnet and bridge.", "mode", "subnet", "bridge")
	descNetworkUp = networkDesc("vmnetctl_network_up",
		"Whether the network is up with its services (DHCP, DNS) running in the controller (1) or failed to start (0).")
	descNetworkDegraded = networkDesc("vmnetctl_network_degraded",
		"1 while the network's kernel state differs from its configuration (changed behind vmnetctl's back) and a repair has not put it back.")
	descNetworkRepairs = networkDesc("vmnetctl_network_repairs_total",
		"Times the controller found the network changed behind its back (a bridge, address or nftables table gone or altered) and repaired it.")
	descNetworkAttachments = networkDesc("vmnetctl_network_attachments",
		"Attachments of VMs to the network.")
	descLeases = networkDesc("vmnetctl_network_dhcp_leases",
		"Unexpired DHCP leases of the network.")
	descPool = networkDesc("vmnetctl_network_dhcp_pool_addresses",
		"Addresses in the network's DHCP range (dhcpStart to dhcpEnd).")
	descDHCPRequests = networkDesc("vmnetctl_network_dhcp_requests_total",
		"DHCP messages the network's server received, by message type.", "type")
	descDHCPReplies = networkDesc("vmnetctl_network_dhcp_replies_total",
		"DHCP messages the network's server sent, by message type.", "type")
	descDHCPErrors = networkDesc("vmnetctl_network_dhcp_errors_total",
		"DHCP messages dropped: unparsable, not for this server, no address left, or a reply that could not be sent.")
	descDHCPSpoofed = networkDesc("vmnetctl_network_dhcp_spoofed_total",
		"DHCP messages ignored because their client hardware address (chaddr) is not the MAC of the frame that carried them (a VM asking for another MAC).")
	descDHCPLimited = networkDesc("vmnetctl_network_dhcp_limited_total",
		"DHCP messages dropped unanswered because their client sent more than its rate (a burst of 10, then 2 a second).")
	descDNSQueries = networkDesc("vmnetctl_network_dns_queries_total",
		"DNS queries the network's proxy received.")
	descDNSResponses = networkDesc("vmnetctl_network_dns_responses_total",
		"DNS queries the network's proxy handled, by outcome: local (a VM's name), nxdomain (an unknown name under vmnet.internal), forwarded (answered upstream), servfail (no upstream answered), refused (not the network's own name, forwarding off), dropped (not answered: too many in flight).", "outcome")

	descTunnelPeers = networkDesc("vmnetctl_network_tunnel_peers",
		"Hosts a network across hosts floods to from this host (the other entries of its vxlan.hosts).")
	descTunnelMACs = networkDesc("vmnetctl_network_tunnel_remote_macs",
		"MACs this host's bridge of a network across hosts learned behind its tunnel: the other hosts' VMs it talked to.")
	descTunnelBytes = networkDesc("vmnetctl_network_tunnel_bytes_total",
		"Bytes of a network across hosts that its tunnel sent to (tx) or received from (rx) the other hosts.", "direction")
	descTunnelDropped = networkDesc("vmnetctl_network_tunnel_dropped_total",
		"Frames from the other hosts of a network across hosts that the tunnel's guard kept off this host's side (their gateways' traffic, DHCP, router advertisements).")
	descTunnelBGP = networkDesc("vmnetctl_network_tunnel_bgp_established",
		"A network across hosts with EVPN: the other hosts whose BGP session with this host's FRR is established.")
	descWireGuardHandshake = networkDesc("vmnetctl_network_wireguard_last_handshake_seconds",
		"A network across hosts with an encrypted underlay: the Unix time of the last WireGuard handshake with each other host (0: none yet). Older than 3 minutes: the session is down.", "host")
	descWireGuardBytes = networkDesc("vmnetctl_network_wireguard_bytes_total",
		"A network across hosts with an encrypted underlay: encrypted bytes sent to (tx) or received from (rx) each other host.", "host", "direction")
	descEgressDenied = networkDesc("vmnetctl_network_egress_denied_total",
		"Connections the network's VMs opened that its egress policy refused (networks with one).")
	descNeighLimited = networkDesc("vmnetctl_network_neighbour_limited_total",
		"Connections the network's VMs opened that were refused because they would have made the host resolve more next hops than the network may (its share of the host's neighbour table) or faster than a VM port may.")
	descRAs = networkDesc("vmnetctl_network_ipv6_router_advertisements_total",
		"IPv6 router advertisements the network sent (periodic, and in reply to solicitations).")
	descRSs = networkDesc("vmnetctl_network_ipv6_router_solicitations_total",
		"IPv6 router solicitations the network received from VMs, by whether they got a reply of their own (answered) or shared one under the rate limit (limited).", "outcome")
	descIPv6Addrs = networkDesc("vmnetctl_network_ipv6_addresses",
		"IPv6 addresses (link-local included) the network has bound to its VMs, learned from neighbour discovery.")
	descIPv6Conflicts = networkDesc("vmnetctl_network_ipv6_address_conflicts_total",
		"Claims of an IPv6 address refused: taken (bound to another VM: first come, first served) or limit (past 4096 addresses in the network).", "reason")

	descReconciles = prometheus.NewDesc("vmnetctl_reconciles_total",
		"Reconciles by result (success or error).", []string{"result"}, nil)
	descReconcileDuration = prometheus.NewDesc("vmnetctl_reconcile_duration_seconds",
		"How long the latest reconcile took.", nil, nil)
	descReconcilePhase = prometheus.NewDesc("vmnetctl_reconcile_phase_seconds_total",
		"Time the reconciles spent in each of their steps, all together: desired (reading and resolving the projects), stop, repair, networks, names, partitions, forwards, claims, start (the helpers'), bandwidth, ports, commit.", []string{"phase"}, nil)
	descLastSuccess = prometheus.NewDesc("vmnetctl_last_successful_reconcile_timestamp_seconds",
		"When a reconcile last succeeded, as a Unix time.", nil, nil)
	descBuildInfo = prometheus.NewDesc("vmnetctl_build_info",
		"The controller's version, commit and Go version (always 1).", []string{"version", "commit", "goversion"}, nil)
)

// The DHCP message types and DNS outcomes are always exported, at 0 until
// they happen, so that rate() over them works from the first scrape.
var (
	dhcpRequestTypes = []string{"DISCOVER", "REQUEST", "RELEASE", "DECLINE", "INFORM", "other"}
	dhcpReplyTypes   = []string{"OFFER", "ACK", "NAK"}
)

// collector reads the controller's state at scrape time, under its lock.
type collector struct{ c *Controller }

func (*collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descAttachmentInfo, descBytes, descPackets, descDrops, descSpoofDrops, descForwardConns, descAttachmentEgressDenied, descBandwidthLimit, descSyscalls, descStatsTime,
		descHelperUp, descRestarts, descStartDuration, descStartTime, descCPU, descRSS,
		descNetworkInfo, descNetworkUp, descNetworkDegraded, descNetworkRepairs, descNetworkAttachments, descLeases, descPool,
		descDHCPRequests, descDHCPReplies, descDHCPErrors, descDHCPSpoofed, descDHCPLimited, descDNSQueries, descDNSResponses,
		descRAs, descRSs, descIPv6Addrs, descIPv6Conflicts, descEgressDenied, descNeighLimited, descTunnelPeers, descTunnelMACs, descTunnelBytes, descTunnelDropped, descTunnelBGP,
		descWireGuardHandshake, descWireGuardBytes,
		descReconciles, descReconcileDuration, descReconcilePhase, descLastSuccess, descBuildInfo,
	} {
		ch <- d
	}
}

// emitter sends one constant metric to a scrape.
type emitter func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string)

func (col *collector) Collect(ch chan<- prometheus.Metric) {
	c := col.c
	emit := emitter(func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	})
	emit(descBuildInfo, prometheus.GaugeValue, 1, c.opts.Version, BuildCommit(), runtime.Version())

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, result := range []string{"success", "error"} {
		emit(descReconciles, prometheus.CounterValue, float64(c.reconciles[result]), result)
	}
	if c.reconciles["success"]+c.reconciles["error"] > 0 {
		emit(descReconcileDuration, prometheus.GaugeValue, c.lastReconcileTime.Seconds())
	}
	spent := c.progress.spentIn()
	for _, id := range slices.Sorted(maps.Keys(phases)) {
		emit(descReconcilePhase, prometheus.CounterValue, spent[id].Seconds(), id)
	}
	if !c.lastOK.IsZero() {
		emit(descLastSuccess, prometheus.GaugeValue, unixSeconds(c.lastOK))
	}
	d := c.applied
	if d == nil {
		d = &spec.Desired{}
	}
	stats := map[string]backend.ServiceStats{}
	for _, n := range d.Networks {
		stats[n.ID] = c.collectNetwork(emit, n, d)
	}
	for _, a := range d.Attachments {
		c.collectAttachment(emit, a, stats[a.Network])
	}
}

// collectNetwork emits a network's metrics and its services', and returns
// its services' stats (zero when it does not run).
func (c *Controller) collectNetwork(emit emitter, n *api.Network, d *spec.Desired) backend.ServiceStats {
	subnet := ""
	if n.Subnet.IsValid() {
		subnet = n.Subnet.String()
	}
	emit(descNetworkInfo, prometheus.GaugeValue, 1, n.ID, string(n.Mode), subnet, n.Bridge())
	attachments := 0
	for _, a := range d.Attachments {
		if a.Network == n.ID {
			attachments++
		}
	}
	emit(descNetworkAttachments, prometheus.GaugeValue, float64(attachments), n.ID)
	nw := c.nets[n.ID]
	emit(descNetworkUp, prometheus.GaugeValue, boolFloat(nw != nil), n.ID)
	emit(descNetworkDegraded, prometheus.GaugeValue, boolFloat(c.degraded[n.ID] != ""), n.ID)
	emit(descNetworkRepairs, prometheus.CounterValue, float64(c.repairs[n.ID]), n.ID)
	if nw == nil {
		return backend.ServiceStats{}
	}
	st := nw.Stats(nil)
	if n.DHCP {
		emit(descLeases, prometheus.GaugeValue, float64(len(nw.Leases())), n.ID)
		emit(descPool, prometheus.GaugeValue, float64(metrics.PoolSize(n.DHCPStart, n.DHCPEnd)), n.ID)
		for _, t := range withKnown(st.DHCP.Requests, dhcpRequestTypes) {
			emit(descDHCPRequests, prometheus.CounterValue, float64(st.DHCP.Requests[t]), n.ID, strings.ToLower(t))
		}
		for _, t := range withKnown(st.DHCP.Replies, dhcpReplyTypes) {
			emit(descDHCPReplies, prometheus.CounterValue, float64(st.DHCP.Replies[t]), n.ID, strings.ToLower(t))
		}
		emit(descDHCPErrors, prometheus.CounterValue, float64(st.DHCP.Errors), n.ID)
		emit(descDHCPSpoofed, prometheus.CounterValue, float64(st.DHCP.Spoofed), n.ID)
		emit(descDHCPLimited, prometheus.CounterValue, float64(st.DHCP.Limited), n.ID)
	}
	if n.DNSProxy {
		emit(descDNSQueries, prometheus.CounterValue, float64(st.DNS.Queries), n.ID)
		for _, o := range []struct {
			outcome string
			v       uint64
		}{{"local", st.DNS.Local}, {"nxdomain", st.DNS.NXDomain}, {"forwarded", st.DNS.Forwarded}, {"servfail", st.DNS.ForwardErrors},
			{"refused", st.DNS.Refused}, {"dropped", st.DNS.Dropped}} {
			emit(descDNSResponses, prometheus.CounterValue, float64(o.v), n.ID, o.outcome)
		}
	}
	if n.Egress != nil {
		emit(descEgressDenied, prometheus.CounterValue, float64(st.EgressDenied), n.ID)
	}
	if n.Routed() {
		emit(descNeighLimited, prometheus.CounterValue, float64(st.NeighLimited), n.ID)
	}
	if t := st.Tunnel; t != nil {
		emit(descTunnelPeers, prometheus.GaugeValue, float64(len(t.Peers)), n.ID)
		emit(descTunnelMACs, prometheus.GaugeValue, float64(t.RemoteMACs), n.ID)
		emit(descTunnelBytes, prometheus.CounterValue, float64(t.TxBytes), n.ID, "tx")
		emit(descTunnelBytes, prometheus.CounterValue, float64(t.RxBytes), n.ID, "rx")
		emit(descTunnelDropped, prometheus.CounterValue, float64(t.Dropped), n.ID)
		if t.BGPSessions != nil {
			emit(descTunnelBGP, prometheus.GaugeValue, float64(t.BGPEstablished()), n.ID)
		}
		for _, p := range t.WireGuard {
			hs := 0.0
			if !p.LastHandshake.IsZero() {
				hs = float64(p.LastHandshake.Unix())
			}
			emit(descWireGuardHandshake, prometheus.GaugeValue, hs, n.ID, p.Host)
			emit(descWireGuardBytes, prometheus.CounterValue, float64(p.TxBytes), n.ID, p.Host, "tx")
			emit(descWireGuardBytes, prometheus.CounterValue, float64(p.RxBytes), n.ID, p.Host, "rx")
		}
	}
	if n.HasIPv6() {
		v6 := st.IPv6
		if n.RouterAdvertisement {
			emit(descRAs, prometheus.CounterValue, float64(v6.RouterAdvertisements), n.ID)
			emit(descRSs, prometheus.CounterValue, float64(v6.Solicitations-v6.SolicitationsLimited), n.ID, "answered")
			emit(descRSs, prometheus.CounterValue, float64(v6.SolicitationsLimited), n.ID, "limited")
		}
		emit(descIPv6Addrs, prometheus.GaugeValue, float64(v6.Bindings), n.ID)
		emit(descIPv6Conflicts, prometheus.CounterValue, float64(v6.Conflicts), n.ID, "taken")
		emit(descIPv6Conflicts, prometheus.CounterValue, float64(v6.Refused), n.ID, "limit")
	}
	return st
}

// collectAttachment emits an attachment's metrics and its helper's; st
// is its network's services' stats.
func (c *Controller) collectAttachment(emit emitter, a *spec.Attachment, st backend.ServiceStats) {
	labels := []string{a.Network, a.VM, strconv.Itoa(a.Index)}
	with := func(extra ...string) []string { return append(append([]string{}, labels...), extra...) }
	emit(descAttachmentInfo, prometheus.GaugeValue, 1, with(a.Project, string(a.Attach))...)
	for _, pf := range a.PortForwards {
		emit(descForwardConns, prometheus.CounterValue, float64(st.ForwardConns[backend.ForwardKey(a.Key(), pf)]), with(pf.String())...)
	}
	if b := a.Bandwidth; b != nil {
		for dir, rate := range map[string]uint64{"to_vm": b.ToVM, "from_vm": b.FromVM} {
			if rate > 0 {
				emit(descBandwidthLimit, prometheus.GaugeValue, float64(rate)/8, with(dir)...)
			}
		}
	}
	if n := c.applied.Network(a.Network); a.Egress != nil || (n != nil && n.Egress != nil) {
		emit(descAttachmentEgressDenied, prometheus.CounterValue, float64(st.EgressDeniedByMAC[a.MAC]), labels...)
	}
	guard := st.GuardDrops
	h := c.helpers[a.Key()]
	up := h != nil && h.state == ctlapi.StateRunning && !isClosed(h.exited)
	emit(descHelperUp, prometheus.GaugeValue, boolFloat(up), labels...)
	if h == nil {
		return
	}
	emit(descRestarts, prometheus.CounterValue, float64(h.rec.Restarts), labels...)
	if guard != nil && h.rec.Tap != "" {
		emit(descSpoofDrops, prometheus.CounterValue, float64(guard[h.rec.Tap]), labels...)
	}
	s := c.observeMovedLocked(a.Key(), h).Last()
	if s.Time.IsZero() {
		s = h.stats // a stats line without a time still has counters
	}
	for _, dir := range []struct {
		name string
		c    helperproto.Counters
	}{{"to_vm", s.Host}, {"from_vm", s.VM}} {
		emit(descBytes, prometheus.CounterValue, float64(dir.c.Bytes), with(dir.name)...)
		emit(descPackets, prometheus.CounterValue, float64(dir.c.Packets), with(dir.name)...)
		emit(descDrops, prometheus.CounterValue, float64(dir.c.Drops), with(dir.name)...)
		emit(descSyscalls, prometheus.CounterValue, float64(dir.c.Fast), with(dir.name, "fast")...)
		emit(descSyscalls, prometheus.CounterValue, float64(dir.c.Slow), with(dir.name, "slow")...)
	}
	if !s.Time.IsZero() {
		emit(descStatsTime, prometheus.GaugeValue, unixSeconds(s.Time), labels...)
	}
	if !up {
		return
	}
	emit(descStartTime, prometheus.GaugeValue, unixSeconds(h.rec.StartedAt), labels...)
	if h.startLatency > 0 {
		emit(descStartDuration, prometheus.GaugeValue, h.startLatency.Seconds(), labels...)
	}
	if p, err := metrics.ReadProcess(h.rec.Proc.PID); err == nil {
		emit(descCPU, prometheus.CounterValue, p.CPUSeconds, labels...)
		emit(descRSS, prometheus.GaugeValue, float64(p.ResidentBytes), labels...)
	}
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
	if c.meters == nil {
		c.meters = map[string]*trafficMeter{}
	}
	tm := c.meters[key]
	if tm == nil || tm.h != h {
		c.pruneMetersLocked() // rarely: when a helper starts
		tm = &trafficMeter{h: h}
		c.meters[key] = tm
	}
	readStatsLines(h, tm.m.Add)
	return &tm.m
}

// observeMovedLocked is observeLocked for a scrape, which asks about
// every helper: one whose log and stats file are as the last log check
// saw them (rotateLogsLocked, which read them after it looked) is not read
// again, its meter being current. A scrape at 10,000 idle helpers read
// 20,000 files (0.6 GB of allocations in two minutes of scrapes every 10
// s); it now stats them.
func (c *Controller) observeMovedLocked(key string, h *helperProc) *metrics.Meter {
	if tm := c.meters[key]; tm != nil && tm.h == h && h.looked != ([2]fileLook{}) && h.looked == h.lookNow() {
		return &tm.m
	}
	return c.observeLocked(key, h)
}

// pruneMetersLocked forgets the meters of attachments that are gone.
func (c *Controller) pruneMetersLocked() {
	for key, tm := range c.meters {
		if c.helpers[key] != tm.h {
			delete(c.meters, key)
		}
	}
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
	take := func(s helperproto.Stats) {
		if !s.Time.After(h.stats.Time) && !h.stats.Time.IsZero() {
			return // older than what the stats file said (a log's line a minute)
		}
		if s.VM.Packets > h.stats.VM.Packets {
			h.lastFromVM = s.Time
		}
		h.stats = s
		add(s)
	}
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
