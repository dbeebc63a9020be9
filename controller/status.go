package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Status is `vmnetctl status --json`: a stable contract. Fields are only
// ever added. See docs/controller.md.
type Status struct {
	Controller  ControllerStatus   `json:"controller"`
	Networks    []NetworkStatus    `json:"networks"`
	Attachments []AttachmentStatus `json:"attachments"`
	Skipped     []string           `json:"skipped,omitempty"`
}

// ControllerStatus tells whether a controller runs for the state dir.
type ControllerStatus struct {
	Running       bool    `json:"running"`
	PID           int     `json:"pid,omitempty"`
	StateDir      string  `json:"stateDir"`
	UptimeSeconds float64 `json:"uptimeSeconds,omitempty"`
	LastError     string  `json:"lastError,omitempty"`
}

// NetworkStatus is one network that some attachment uses.
type NetworkStatus struct {
	Name      string `json:"name"`
	Mode      string `json:"mode"`
	Bridge    string `json:"bridge,omitempty"`
	Interface string `json:"interface,omitempty"`
	Subnet    string `json:"subnet,omitempty"`
	Gateway   string `json:"gateway,omitempty"`
	// Subnet6 and Gateway6 are the network's IPv6 prefix and gateway;
	// NAT66 whether its IPv6 traffic leaves the host (through NAT66).
	Subnet6  string   `json:"subnet6,omitempty"`
	Gateway6 string   `json:"gateway6,omitempty"`
	NAT66    bool     `json:"nat66,omitempty"`
	VMs      []string `json:"vms"`
	// State is "up" when the kernel has the network as configured, "down"
	// when it is missing, "degraded" with Error set when something changed
	// it behind vmnetctl's back and a repair has not (yet) put it back,
	// "error" with Error set otherwise.
	State  string `json:"state"`
	Error  string `json:"error,omitempty"`
	Leases int    `json:"leases"`
	// Repairs counts the times the controller found the network changed
	// behind its back and put it back.
	Repairs uint64 `json:"repairs"`
	// EgressDenied counts the connections its VMs opened that the
	// network's egress policy refused.
	EgressDenied uint64 `json:"egressDenied,omitempty"`
	// NeighLimited counts the connections its VMs opened to more next
	// hops than the host's neighbour table may hold for the network
	// (docs/security.md), refused.
	NeighLimited uint64 `json:"neighLimited,omitempty"`
	// Tunnel is the network's segment across hosts as this host sees it
	// (docs/multihost.md); absent for a network of this host alone.
	Tunnel *backend.TunnelStats `json:"tunnel,omitempty"`
}

// AttachmentStatus is one VM's cable to one network.
type AttachmentStatus struct {
	VM      string `json:"vm"`
	Index   int    `json:"index"`
	Network string `json:"network"`
	Project string `json:"project"`
	MAC     string `json:"mac"`
	Attach  string `json:"attach"`
	Socket  string `json:"socket"`
	Tap     string `json:"tap"`
	IP      string `json:"ip"`
	// IPv6 are the VM's addresses in the network's IPv6 prefix, as the
	// network learned them (SLAAC: the VM makes its own).
	IPv6     []string `json:"ipv6,omitempty"`
	PID      int      `json:"pid"`
	State    string   `json:"state"`
	Restarts int      `json:"restarts"`
	// UptimeSeconds is how long the current helper has run.
	UptimeSeconds float64 `json:"uptimeSeconds"`
	Error         string  `json:"error,omitempty"`
	// Cumulative counters from the helper's stats: To is towards the VM.
	RxBytes uint64 `json:"rxBytes"`
	TxBytes uint64 `json:"txBytes"`
	Drops   uint64 `json:"drops"`
	// EgressDenied counts the connections the VM opened that its
	// network's egress policy refused (networks with one).
	EgressDenied uint64 `json:"egressDenied,omitempty"`
	// Forwards are the attachment's port forwards, with the connections
	// each took.
	Forwards []ForwardStatus `json:"forwards,omitempty"`
	// SpoofDrops counts the frames from the VM that the anti-spoofing
	// guard dropped (Linux; docs/security.md).
	SpoofDrops uint64 `json:"spoofDrops"`
	// Peer is whether the VM is there: "connected", "waiting for VM"
	// (no VMM came yet), "VM gone" (its VMM's socket is gone), or ""
	// when the helper does not run.
	Peer string `json:"peer,omitempty"`
	// LastFrameAt is when the helper last counted a frame from the VM.
	LastFrameAt time.Time `json:"lastFrameAt,omitzero"`
	// SeenMACs are the MACs the bridge learned on the VM's port (Linux):
	// the VM's, which should be MAC.
	SeenMACs []string `json:"seenMACs,omitempty"`
	// Current rates over the helper's latest stats interval, in bits per
	// second: Rx is what the VM sent, Tx what it was sent. Zero until the
	// helper has reported twice, and when it stopped reporting.
	RxBitsPerSecond float64 `json:"rxBitsPerSecond"`
	TxBitsPerSecond float64 `json:"txBitsPerSecond"`
}

// ForwardStatus is one port forward: "HOSTIP:PORT -> GUESTPORT/PROTO".
type ForwardStatus struct {
	Forward     string `json:"forward"`
	Connections uint64 `json:"connections"`
}

// peerOf says whether a running helper's VM is there.
func peerOf(a *Attachment, h *helperProc) string {
	switch {
	case a.Attach == api.AttachTAP:
		// A TAP's carrier is on while a VMM holds it.
		if b, err := os.ReadFile("/sys/class/net/" + h.rec.Tap + "/carrier"); err == nil && strings.TrimSpace(string(b)) == "1" {
			return "connected"
		}
		return "waiting for VM"
	case a.External:
		return "connected" // vmnetctl run: the VM holds the other end
	case h.client == "":
		return "waiting for VM"
	}
	if !socketLive(h.client) {
		return "VM gone"
	}
	return "connected"
}

// socketLive says whether a datagram socket is bound at path: a VMM that
// exited leaves its socket file (qemu does), to which a connect is
// refused. (One connected to the helper, as vfkit's, refuses others with
// EPERM: live.)
func socketLive(path string) bool {
	c, err := net.Dial("unixgram", path)
	if err == nil {
		c.Close()
	}
	return !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, fs.ErrNotExist)
}

// status builds the live status; the caller holds no lock.
func (c *Controller) status() *Status { return c.statusOf("") }

// statusOf is the status of project's attachments and of the networks
// they use or the project keeps up ("" for everything): what `up` of one
// VM prints, without reading the ports, leases and counters of the
// thousands of others.
func (c *Controller) statusOf(project string) *Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &Status{Controller: ControllerStatus{Running: true, PID: os.Getpid(), StateDir: c.sd.Path,
		UptimeSeconds: time.Since(c.started).Seconds()}}
	if c.lastErr != nil {
		st.Controller.LastError = c.lastErr.Error()
	}
	d := c.applied
	if d == nil {
		d = &Desired{}
	}
	st.Skipped = d.Skipped
	if project != "" {
		d = d.ofProject(project, c.appliedP)
	}
	f := runFacts{ips: map[string]string{}, ip6s: map[string][]netip.Addr{}, denied: map[string]uint64{},
		guards: map[string]map[string]uint64{}, portMACs: map[string]map[string][]string{}, conns: map[string]uint64{}}
	ports := c.portsOfLocked(d, project != "")
	for _, n := range d.Networks {
		st.Networks = append(st.Networks, c.networkStatusLocked(n, d, ports, &f))
	}
	for _, a := range d.Attachments {
		st.Attachments = append(st.Attachments, c.attachmentStatusLocked(a, &f))
	}
	if st.Networks == nil {
		st.Networks = []NetworkStatus{}
	}
	if st.Attachments == nil {
		st.Attachments = []AttachmentStatus{}
	}
	return st
}

// runFacts is what the running networks say of their VMs for a status:
// by network/MAC, the IPv4 lease (ips), the IPv6 addresses (ip6s) and the
// egress refusals (denied); by network and port, the guard's drops
// (guards) and the MACs the bridge learned (portMACs); by
// backend.ForwardKey, a forward's connections (conns).
type runFacts struct {
	ips      map[string]string
	ip6s     map[string][]netip.Addr
	denied   map[string]uint64
	guards   map[string]map[string]uint64
	portMACs map[string]map[string][]string
	conns    map[string]uint64
}

// portsOfLocked is, for a project's status (project), its VMs' ports by
// network, so that the networks read those ports, not all theirs; nil
// for the whole status. Call with c.mu held.
func (c *Controller) portsOfLocked(d *Desired, project bool) map[string][]string {
	if !project {
		return nil
	}
	ports := map[string][]string{}
	for _, a := range d.Attachments {
		if h := c.helpers[a.Key()]; h != nil && h.rec.Tap != "" {
			ports[a.Network] = append(ports[a.Network], h.rec.Tap)
		}
	}
	return ports
}

// networkStatusLocked is network n's status, its stats read from the
// running network (of ports only, if ports is set) into f. Call with c.mu
// held.
func (c *Controller) networkStatusLocked(n *api.Network, d *Desired, ports map[string][]string, f *runFacts) NetworkStatus {
	ns := newNetworkStatus(n, d)
	if nw := c.nets[n.ID]; nw != nil {
		ns.State = "up"
		var only []string
		if ports != nil {
			only = append([]string{}, ports[n.ID]...) // not nil: none
		}
		st := nw.Stats(only)
		f.guards[n.ID], f.portMACs[n.ID] = st.GuardDrops, st.PortMACs
		ns.EgressDenied, ns.NeighLimited, ns.Tunnel = st.EgressDenied, st.NeighLimited, st.Tunnel
		for mac, v := range st.EgressDeniedByMAC {
			f.denied[n.ID+"/"+mac] = v
		}
		for k, v := range st.ForwardConns {
			f.conns[k] = v
		}
		for mac, ips := range st.IPv6Addrs {
			f.ip6s[n.ID+"/"+mac] = ips
		}
		for _, l := range nw.Leases() {
			f.ips[n.ID+"/"+l.MAC] = l.IP.String()
		}
		ns.Leases = len(nw.Leases())
	} else if msg := c.netErrs[n.ID]; msg != "" {
		ns.State, ns.Error = "error", msg
	}
	// Degraded from the moment drift is found, while the repair runs
	// and for as long as repairs fail (with their error).
	if why := c.degraded[n.ID]; why != "" {
		ns.State, ns.Error = "degraded", why
		if msg := c.netErrs[n.ID]; msg != "" {
			ns.Error += "; repairing failed: " + msg
		}
	}
	ns.Repairs = c.repairs[n.ID]
	return ns
}

// attachmentStatusLocked is a's status, with what its network said of it
// (f) and what its helper does. Call with c.mu held.
func (c *Controller) attachmentStatusLocked(a *Attachment, f *runFacts) AttachmentStatus {
	as := newAttachmentStatus(a)
	if ip := f.ips[a.Network+"/"+a.MAC]; ip != "" {
		as.IP = ip
	}
	for _, ip := range f.ip6s[a.Network+"/"+a.MAC] {
		as.IPv6 = append(as.IPv6, ip.String())
	}
	as.EgressDenied = f.denied[a.Network+"/"+a.MAC]
	for _, pf := range a.PortForwards {
		as.Forwards = append(as.Forwards, ForwardStatus{Forward: pf.String(), Connections: f.conns[backend.ForwardKey(a.Key(), pf)]})
	}
	h := c.helpers[a.Key()]
	if h == nil {
		return as
	}
	meter := c.observeLocked(a.Key(), h)
	as.State, as.Restarts, as.Error = h.state, h.rec.Restarts, h.lastErr
	as.Socket, as.Tap = h.rec.Socket, h.rec.Tap
	as.SpoofDrops = f.guards[a.Network][h.rec.Tap]
	as.SeenMACs = f.portMACs[a.Network][h.rec.Tap]
	as.LastFrameAt = h.lastFromVM
	as.RxBytes, as.TxBytes = h.stats.VM.Bytes, h.stats.Host.Bytes
	as.Drops = h.stats.VM.Drops + h.stats.Host.Drops
	if h.state == StateRunning {
		as.Peer = peerOf(a, h)
		as.PID = h.rec.Proc.PID
		as.UptimeSeconds = time.Since(h.rec.StartedAt).Seconds()
		as.Error = ""
		r := meter.Rates(time.Now(), c.rateMaxAge())
		as.RxBitsPerSecond, as.TxBitsPerSecond = r.FromVM, r.ToVM
	}
	return as
}

// newNetworkStatus is n's status as configured, with the VMs of d on it,
// before anything is known of what runs.
func newNetworkStatus(n *api.Network, d *Desired) NetworkStatus {
	ns := NetworkStatus{Name: n.ID, Mode: string(n.Mode), Bridge: n.Bridge(), Interface: n.Interface, VMs: []string{}, State: "down"}
	if n.Subnet.IsValid() {
		ns.Subnet, ns.Gateway = n.Subnet.String(), n.Gateway.String()
	}
	if n.HasIPv6() && runtime.GOOS == "linux" { // on macOS vmnet chooses the prefix
		ns.Subnet6, ns.Gateway6, ns.NAT66 = n.Subnet6.String(), n.Gateway6.String(), n.RoutesIPv6()
	}
	for _, a := range d.Attachments {
		if a.Network == n.ID && !slices.Contains(ns.VMs, a.VM) {
			ns.VMs = append(ns.VMs, a.VM)
		}
	}
	return ns
}

// newAttachmentStatus is a's status before anything is known of its helper.
func newAttachmentStatus(a *Attachment) AttachmentStatus {
	as := AttachmentStatus{VM: a.VM, Index: a.Index, Network: a.Network, Project: a.Project, MAC: a.MAC, Attach: string(a.Attach), State: StateStopped}
	if a.IP.IsValid() {
		as.IP = a.IP.String()
	}
	return as
}

// OfflineStatus reads the status from the state dir, the kernel and the
// process table when no controller runs.
func OfflineStatus(ctx context.Context, sd statedir.Dir) (*Status, error) {
	return offlineStatus(ctx, sd, DefaultBackend())
}

// rootStateDir and euid are root's state dir and this process's user,
// variables for the tests.
var (
	rootStateDir = statedir.Root
	euid         = os.Geteuid
)

// rootsInstead: a user's own state dir holds nothing, but root's is in use
// (its controller's socket is there, or the dir is root's alone). Saying
// "Nothing is running" would be wrong: the user is to use sudo.
func rootsInstead(sd statedir.Dir) error {
	if euid() == 0 || filepath.Clean(sd.Path) == rootStateDir {
		return nil
	}
	root := statedir.Dir{Path: rootStateDir}
	if _, err := os.Stat(root.APISocket()); err == nil || errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("nothing runs in this user's state dir %s, but root's %s is in use: run with sudo (sudo vmnetctl status)", sd.Path, rootStateDir)
	}
	return nil
}

func offlineStatus(ctx context.Context, sd statedir.Dir, be backend.Backend) (*Status, error) {
	st := &Status{Controller: ControllerStatus{StateDir: sd.Path}, Networks: []NetworkStatus{}, Attachments: []AttachmentStatus{}}
	rs, found, err := sd.LoadRuntime()
	if err != nil {
		// What ran cannot be read (a truncated or garbage record): say
		// so, and what would put it right, rather than fail; the
		// controller starts afresh from such a record too (restore).
		st.Controller.LastError = fmt.Sprintf("%v: nothing can be said of what runs; `vmnetctl up` records it again", err)
		rs, found = statedir.Runtime{}, true
	}
	if !found {
		if err := rootsInstead(sd); err != nil {
			return nil, err
		}
	}
	d, err := appliedDesired(rs)
	if err != nil {
		return nil, err
	}
	recs := map[string]statedir.HelperRecord{}
	for _, r := range rs.Helpers {
		recs[r.Key] = r
	}
	ips := map[string]string{} // network/mac → ip
	for _, n := range d.Networks {
		ns := newNetworkStatus(n, d)
		// Check compares the kernel with what the network needs; Inspect
		// alone would read an empty state as fine.
		if err := be.CheckNetwork(ctx, n, backend.NetworkOptions{Owner: sd.Path}); err == nil {
			ns.State = "up"
		} else {
			ns.State, ns.Error = "error", err.Error()
		}
		// The lease files say what DHCP handed out, controller or not.
		if ls, err := leasesOf(be, sd, n); err == nil {
			ns.Leases = len(ls)
			for _, l := range ls {
				ips[n.ID+"/"+l.MAC] = l.IP.String()
			}
		}
		st.Networks = append(st.Networks, ns)
	}
	for _, a := range d.Attachments {
		as := newAttachmentStatus(a)
		if ip := ips[a.Network+"/"+a.MAC]; ip != "" {
			as.IP = ip
		}
		if r, ok := recs[a.Key()]; ok {
			as.Socket, as.Tap, as.Restarts = r.Socket, r.Tap, r.Restarts
			if r.Proc.Alive() {
				as.State, as.PID = StateRunning, r.Proc.PID
				as.UptimeSeconds = time.Since(r.StartedAt).Seconds()
			}
		}
		st.Attachments = append(st.Attachments, as)
	}
	return st, nil
}

// Render writes the status as tables.
func (st *Status) Render(w io.Writer) error { return st.render(w, time.Now()) }

// render is Render at time now (the last frame's age).
func (st *Status) render(w io.Writer, now time.Time) error {
	if st.Controller.Running {
		fmt.Fprintf(w, "Controller: running (pid %d, up %s), state dir %s\n", st.Controller.PID, roundDur(st.Controller.UptimeSeconds), st.Controller.StateDir)
	} else {
		fmt.Fprintf(w, "Controller: not running, state dir %s\n", st.Controller.StateDir)
	}
	if st.Controller.LastError != "" {
		fmt.Fprintf(w, "Last error: %s\n", st.Controller.LastError)
	}
	if len(st.Networks) == 0 && len(st.Attachments) == 0 {
		_, err := fmt.Fprintln(w, "Nothing is running.")
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tMODE\tBRIDGE\tSUBNET\tGATEWAY\tIPV6\tSTATE\tLEASES\tVMS")
	for _, n := range st.Networks {
		bridge := n.Bridge
		if bridge == "" {
			bridge = "onto " + n.Interface
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Name, n.Mode, bridge, dash(n.Subnet), dash(n.Gateway), dash(n.Subnet6), n.State, n.Leases, strings.Join(n.VMs, ","))
	}
	tw.Flush()
	for _, n := range st.Networks {
		if t := n.Tunnel; t != nil {
			fmt.Fprintf(w, "%s spans hosts: this is %s; the tunnel floods to %s, %d remote MACs, %s sent, %s received, %d frames kept off\n",
				n.Name, t.Host, strings.Join(t.Peers, ", "), t.RemoteMACs, formatBytes(t.TxBytes), formatBytes(t.RxBytes), t.Dropped)
			switch {
			case t.BGPPeers == 0:
			case t.BGPError != "":
				fmt.Fprintf(w, "%s's EVPN: %d of %d BGP sessions established (FRR: %s)\n", n.Name, t.BGPEstablished(), t.BGPPeers, t.BGPError)
			case t.BGPSessions == nil:
				fmt.Fprintf(w, "%s's EVPN: %d BGP sessions, not read from FRR yet\n", n.Name, t.BGPPeers)
			default:
				fmt.Fprintf(w, "%s's EVPN: %d of %d BGP sessions established\n", n.Name, t.BGPEstablished(), t.BGPPeers)
			}
			for _, p := range t.WireGuard {
				fmt.Fprintf(w, "  encrypted to %s: %s, %s sent, %s received\n", p.Host, handshakeAge(p.LastHandshake, time.Now()), formatBytes(p.TxBytes), formatBytes(p.RxBytes))
			}
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tNETWORK\tMAC\tATTACHMENT\tIP\tIPV6\tPID\tSTATE\tPEER\tLAST FRAME\tRESTARTS\tUPTIME\tFROM VM\tTO VM")
	for _, a := range st.Attachments {
		where := a.Socket
		if a.Attach == "tap" {
			where = "tap " + a.Tap
		}
		pid := "-"
		if a.PID > 0 {
			pid = fmt.Sprint(a.PID)
		}
		from, to := "-", "-"
		if st.Controller.Running && a.State == StateRunning { // no rates offline
			from, to = formatBits(a.RxBitsPerSecond), formatBits(a.TxBitsPerSecond)
		}
		last := "-"
		if !a.LastFrameAt.IsZero() {
			last = roundDur(max(now.Sub(a.LastFrameAt).Seconds(), 1)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", a.VM, a.Network, a.MAC, dash(where), dash(a.IP), dash(strings.Join(a.IPv6, ",")), pid, a.State, dash(a.Peer), last, a.Restarts, roundDur(a.UptimeSeconds), from, to)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range st.Attachments {
		if a.Error != "" {
			fmt.Fprintf(w, "\n%s/%d: %s\n", a.VM, a.Index, a.Error)
		}
		if a.SpoofDrops > 0 {
			fmt.Fprintf(w, "\n%s/%d: the anti-spoofing guard dropped %d frames from the VM\n", a.VM, a.Index, a.SpoofDrops)
		}
		if a.Peer == "VM gone" {
			fmt.Fprintf(w, "\n%s/%d: its VM is gone (the VMM's socket is); the helper waits for it to start again\n", a.VM, a.Index)
		}
		for _, m := range a.SeenMACs {
			if !strings.EqualFold(m, a.MAC) {
				fmt.Fprintf(w, "\n%s/%d: the VM sends from MAC %s, not %s (`vmnetctl args %s` gives the VMM the right one)\n", a.VM, a.Index, m, a.MAC, a.VM)
			}
		}
	}
	return nil
}

// formatBits writes a rate in bits per second with an SI prefix: "0",
// "950 b/s", "12.3 Mb/s".
func formatBits(bps float64) string {
	return formatUnits(bps, []string{"b/s", "kb/s", "Mb/s", "Gb/s", "Tb/s"})
}

// formatBytes is n bytes, as formatBits writes a rate.
func formatBytes(n uint64) string {
	return formatUnits(float64(n), []string{"B", "kB", "MB", "GB", "TB"})
}

// formatUnits writes v in the largest of units (steps of 1000) that keeps
// it at least 1, with a decimal below 100.
func formatUnits(v float64, units []string) string {
	if v < 0.5 {
		return "0"
	}
	i := 0
	for v >= 999.5 && i < len(units)-1 {
		v /= 1000
		i++
	}
	if i == 0 || v >= 99.95 {
		return fmt.Sprintf("%.0f %s", v, units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func roundDur(secs float64) string {
	if secs <= 0 {
		return "-"
	}
	return (time.Duration(secs) * time.Second).Round(time.Second).String()
}

// AppliedState is what the controller last applied, from runtime.json; an
// empty state when nothing was.
func AppliedState(sd statedir.Dir) (*Desired, error) {
	rs, _, err := sd.LoadRuntime()
	if err != nil {
		return nil, err
	}
	return appliedDesired(rs)
}

// appliedDesired is the desired state a runtime record says was applied;
// an empty one when nothing was.
func appliedDesired(rs statedir.Runtime) (*Desired, error) {
	if rs.AppliedNetworks == nil {
		return &Desired{}, nil
	}
	nets, err := rs.AppliedNetworks.Load()
	if err != nil {
		return nil, err
	}
	return ComputeDesired(nets, rs.AppliedProjects, keptMACs(rs.Helpers))
}

// RenderProject writes the attachments of one project as a table, and fails
// when one is not running.
func (st *Status) RenderProject(w io.Writer, project string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tNETWORK\tMAC\tATTACHMENT\tIP\tSTATE")
	var failed []string
	for _, a := range st.Attachments {
		if a.Project != project {
			continue
		}
		where := a.Socket
		if a.Attach == "tap" {
			where = "tap " + a.Tap
		}
		ip := a.IP
		if ip == "" {
			ip = "(dhcp, not yet leased)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.VM, a.Network, a.MAC, where, ip, a.State)
		if a.State != StateRunning {
			failed = append(failed, fmt.Sprintf("%s/%d on %s: %s", a.VM, a.Index, a.Network, a.Error))
		}
	}
	tw.Flush()
	for _, sk := range st.Skipped {
		fmt.Fprintln(w, "skipped:", sk)
	}
	if len(failed) > 0 {
		return errors.New("not every attachment is running:\n" + strings.Join(failed, "\n"))
	}
	return nil
}

// LeaseStatus is one DHCP lease, with the VM it belongs to.
type LeaseStatus struct {
	Network  string    `json:"network"`
	IP       string    `json:"ip"`
	MAC      string    `json:"mac"`
	Hostname string    `json:"hostname,omitempty"`
	VM       string    `json:"vm,omitempty"`
	Expiry   time.Time `json:"expiry"`
}

// LeaseList is `vmnetctl leases`.
type LeaseList struct {
	Leases []LeaseStatus `json:"leases"`
}

// Leases lists the unexpired DHCP leases of the state dir's networks (of
// network only, if set), from the lease files: a controller need not run.
// A lease's VM is the attachment with its MAC.
func Leases(sd statedir.Dir, network string) (*LeaseList, error) {
	be := DefaultBackend()
	d, err := AppliedState(sd)
	if err != nil {
		return nil, err
	}
	vms := map[string]string{} // network/mac → VM
	for _, a := range d.Attachments {
		vms[a.Network+"/"+a.MAC] = a.VM
	}
	list := &LeaseList{Leases: []LeaseStatus{}}
	found := network == ""
	for _, n := range d.Networks {
		if network != "" && n.ID != network {
			continue
		}
		found = true
		ls, err := leasesOf(be, sd, n)
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			list.Leases = append(list.Leases, LeaseStatus{Network: n.ID, IP: l.IP.String(), MAC: l.MAC,
				Hostname: l.Hostname, VM: vms[n.ID+"/"+l.MAC], Expiry: l.Expiry})
		}
	}
	if !found {
		return nil, fmt.Errorf("network %q is not up in %s", network, sd.Path)
	}
	return list, nil
}

// leasesOf reads network n's unexpired leases as be's DHCP server keeps
// them on disk, for state dir sd: a controller need not run.
func leasesOf(be backend.Backend, sd statedir.Dir, n *api.Network) ([]backend.Lease, error) {
	return be.StoredLeases(n, backend.NetworkOptions{Owner: sd.Path, LeaseDir: sd.LeasesDir()})
}

// Render writes the leases as a table.
func (l *LeaseList) Render(w io.Writer) error {
	if len(l.Leases) == 0 {
		_, err := fmt.Fprintln(w, "No leases.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tIP\tMAC\tHOSTNAME\tVM\tEXPIRES")
	for _, x := range l.Leases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", x.Network, x.IP, x.MAC, dash(x.Hostname), dash(x.VM), x.Expiry.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// handshakeAge says how long ago a WireGuard handshake was, and whether
// the session is down (no handshake in 3 minutes: WireGuard renews every
// 2, and gives up on a key after 3).
func handshakeAge(at, now time.Time) string {
	switch age := now.Sub(at).Truncate(time.Second); {
	case at.IsZero():
		return "no handshake yet"
	case age > 3*time.Minute:
		return fmt.Sprintf("DOWN, last handshake %s ago", age)
	default:
		return fmt.Sprintf("handshake %s ago", age)
	}
}
