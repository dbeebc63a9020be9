package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// OfflineStatus reads the status from the state dir, the kernel and the
// process table when no controller runs.
func OfflineStatus(ctx context.Context, sd statedir.Dir) (*ctlapi.Status, error) {
	return offlineStatus(ctx, sd, backends.Default())
}

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

func offlineStatus(ctx context.Context, sd statedir.Dir, be backend.Backend) (*ctlapi.Status, error) {
	st := &ctlapi.Status{Controller: ctlapi.ControllerStatus{StateDir: sd.Path}, Networks: []ctlapi.NetworkStatus{}, Attachments: []ctlapi.AttachmentStatus{}}
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
	d, err := spec.AppliedDesired(rs)
	if err != nil {
		return nil, err
	}
	recs := map[string]statedir.HelperRecord{}
	for _, r := range rs.Helpers {
		recs[r.Key] = r
	}
	ips := map[string]string{} // network/mac → ip
	for _, n := range d.Networks {
		ns := spec.NetworkStatusOf(n, d)
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
		as := spec.AttachmentStatusOf(a)
		if ip := ips[a.Network+"/"+a.MAC]; ip != "" {
			as.IP = ip
		}
		if r, ok := recs[a.Key()]; ok {
			as.Socket, as.Tap, as.Restarts = r.Socket, r.Tap, r.Restarts
			if r.Proc.Alive() {
				as.State, as.PID = ctlapi.StateRunning, r.Proc.PID
				as.UptimeSeconds = time.Since(r.StartedAt).Seconds()
			}
		}
		st.Attachments = append(st.Attachments, as)
	}
	return st, nil
}

// RenderStatus writes st as tables.
func RenderStatus(w io.Writer, st *ctlapi.Status) error { return renderStatus(w, st, time.Now()) }

// renderPolicies writes what the networks and the attachments (of
// project; "" for all, and the networks' too) allow and expose: egress
// policies and the connections they refused, port forwards and
// bandwidth limits, a line each, after the tables.
func renderPolicies(w io.Writer, st *ctlapi.Status, project string) {
	var lines []string
	for _, n := range st.Networks {
		if n.Egress != "" && project == "" {
			lines = append(lines, fmt.Sprintf("%s: egress %s; %d connections refused", n.Name, n.Egress, n.EgressDenied))
		}
		if n.Partitions != "" && project == "" {
			lines = append(lines, fmt.Sprintf("%s: partitions %s (no frame passes between two groups)", n.Name, n.Partitions))
		}
	}
	for _, a := range st.Attachments {
		if project != "" && a.Project != project {
			continue
		}
		var parts []string
		if a.Egress != "" {
			parts = append(parts, fmt.Sprintf("egress %s; %d connections refused", a.Egress, a.EgressDenied))
		}
		for _, f := range a.Forwards {
			parts = append(parts, fmt.Sprintf("forward %s (%d connections)", f.Forward, f.Connections))
		}
		if a.Impair != nil || a.ImpairSetBy != "" {
			parts = append(parts, ImpairText(a))
		}
		if a.Bandwidth != nil {
			parts = append(parts, "bandwidth "+a.Bandwidth.String())
		}
		if len(parts) > 0 {
			lines = append(lines, fmt.Sprintf("%s/%d on %s: %s", a.VM, a.Index, a.Network, strings.Join(parts, "; ")))
		}
	}
	if len(lines) > 0 {
		fmt.Fprintln(w)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
}

// renderStatus is RenderStatus at time now (the last frame's age).
func renderStatus(w io.Writer, st *ctlapi.Status, now time.Time) error {
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
		if st.Controller.Running && a.State == ctlapi.StateRunning { // no rates offline
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
	renderPolicies(w, st, "")
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

// RenderProject writes the attachments of st of one project as a table, and fails
// when one is not running.
func RenderProject(w io.Writer, st *ctlapi.Status, project string) error {
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
		if a.State != ctlapi.StateRunning {
			failed = append(failed, fmt.Sprintf("%s/%d on %s: %s", a.VM, a.Index, a.Network, a.Error))
		}
	}
	tw.Flush()
	renderPolicies(w, st, project)
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
	be := backends.Default()
	d, err := spec.AppliedState(sd)
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

// rootStateDir and euid are root's state dir and this process's user,
// variables for the tests.
var (
	rootStateDir = statedir.Root
	euid         = os.Geteuid
)
