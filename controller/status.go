package controller

import (
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
)

// peerOf says whether a running helper's VM is there.
func peerOf(a *spec.Attachment, h *helperProc) string {
	switch {
	case a.Attach == api.AttachTAP:
		// A TAP's carrier is on while a VMM holds it.
		if b, err := os.ReadFile("/sys/class/net/" + h.rec.Tap + "/carrier"); err == nil && strings.TrimSpace(string(b)) == "1" {
			return "connected"
		}
		return "waiting for VM"
	case a.External:
		return "connected" // vmnetctl run: the VM holds the other end
	case h.session != "":
		return h.session // a stream's or vhost-user's VMM, from the log
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
func (c *Controller) status() *ctlapi.Status { return c.statusOf("") }

// statusOf is the status of project's attachments and of the networks
// they use or the project keeps up ("" for everything): what `up` of one
// VM prints, without reading the ports, leases and counters of the
// thousands of others.
func (c *Controller) statusOf(project string) *ctlapi.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &ctlapi.Status{Controller: ctlapi.ControllerStatus{Running: true, PID: os.Getpid(), StateDir: c.sd.Path,
		UptimeSeconds: time.Since(c.started).Seconds()}}
	if c.lastErr != nil {
		st.Controller.LastError = c.lastErr.Error()
	}
	d := c.applied
	if d == nil {
		d = &spec.Desired{}
	}
	st.Skipped = d.Skipped
	c.watch.Drain() // (observeForStatusLocked)
	if project != "" {
		d = d.OfProject(project, c.appliedP)
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
		st.Networks = []ctlapi.NetworkStatus{}
	}
	if st.Attachments == nil {
		st.Attachments = []ctlapi.AttachmentStatus{}
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
func (c *Controller) portsOfLocked(d *spec.Desired, project bool) map[string][]string {
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
func (c *Controller) networkStatusLocked(n *api.Network, d *spec.Desired, ports map[string][]string, f *runFacts) ctlapi.NetworkStatus {
	ns := spec.NetworkStatusOf(n, d)
	if nw := c.nets[n.ID]; nw != nil {
		ns.State = "up"
		var only []string
		if ports != nil {
			only = append([]string{}, ports[n.ID]...) // not nil: none
		}
		st := nw.Stats(backend.StatsQuery{Ports: only, MACs: true})
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
func (c *Controller) attachmentStatusLocked(a *spec.Attachment, f *runFacts) ctlapi.AttachmentStatus {
	as := spec.AttachmentStatusOf(a)
	if imp, set := c.impairOf(a); set {
		as.Impair, as.ImpairFile, as.ImpairSetBy = imp, a.Impair, ctlapi.ImpairSetBy
	}
	if ip := f.ips[a.Network+"/"+a.MAC]; ip != "" {
		as.IP = ip
	}
	for _, ip := range f.ip6s[a.Network+"/"+a.MAC] {
		as.IPv6 = append(as.IPv6, ip.String())
	}
	as.EgressDenied = f.denied[a.Network+"/"+a.MAC]
	for _, pf := range a.PortForwards {
		as.Forwards = append(as.Forwards, ctlapi.ForwardStatus{Forward: pf.String(), Connections: f.conns[backend.ForwardKey(a.Key(), pf)]})
	}
	h := c.helpers[a.Key()]
	if h == nil {
		return as
	}
	meter := c.observeForStatusLocked(a.Key(), h)
	as.State, as.Restarts, as.Error = h.state, h.rec.Restarts, h.lastErr
	as.Socket, as.Tap = h.rec.Socket, h.rec.Tap
	as.SpoofDrops = f.guards[a.Network][h.rec.Tap]
	as.SeenMACs = f.portMACs[a.Network][h.rec.Tap]
	as.LastFrameAt, as.StatsAt = h.lastFromVM, h.stats.Time
	as.RxBytes, as.TxBytes = h.stats.VM.Bytes, h.stats.Host.Bytes
	as.Drops = h.stats.VM.Drops + h.stats.Host.Drops
	if h.state == ctlapi.StateRunning {
		as.Peer = peerOf(a, h)
		as.PID = h.rec.Proc.PID
		as.UptimeSeconds = time.Since(h.rec.StartedAt).Seconds()
		as.Error = ""
		r := meter.Rates(time.Now(), c.rateMaxAge())
		as.RxBitsPerSecond, as.TxBitsPerSecond = r.FromVM, r.ToVM
	}
	return as
}
