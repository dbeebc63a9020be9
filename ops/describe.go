package ops

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Description is `vmnetctl describe VM`: everything about a VM's
// attachments, and what to do when something is wrong.
type Description struct {
	VM          string                  `json:"vm"`
	Controller  ctlapi.ControllerStatus `json:"controller"`
	Attachments []AttachmentDescription `json:"attachments"`
}

// AttachmentDescription is one attachment of a described VM.
type AttachmentDescription struct {
	ctlapi.AttachmentStatus
	Lease *LeaseStatus `json:"lease,omitempty"`
	// LastDHCP is the last DHCP event of the attachment's MAC on its
	// network (lease-granted, -released, -declined or -expired), from the
	// events log.
	LastDHCP *ctlapi.Event `json:"lastDHCP,omitempty"`
	// LastHelperError is the helper's last exit or failure (helper-exited,
	// helper-failed), from the events log: kept after the helper restarted.
	LastHelperError *ctlapi.Event `json:"lastHelperError,omitempty"`
	// LogTail is the end of the helper's log.
	LogTail []string `json:"logTail"`
	// Advice says what to do, one line each; empty when all is well.
	Advice []string `json:"advice"`
}

// logTailLines is how much of a helper's log Describe shows.
const logTailLines = 8

// Describe tells everything about vm's attachments: status, peer, lease,
// drops, the end of the helper's log, and what to do.
func Describe(ctx context.Context, sd statedir.Dir, vm string) (*Description, error) {
	st, err := CurrentStatus(ctx, sd)
	if err != nil {
		return nil, err
	}
	leases, _ := Leases(sd, "")
	d := &Description{VM: vm, Controller: st.Controller, Attachments: []AttachmentDescription{}}
	var names []string
	for _, a := range st.Attachments {
		if !slices.Contains(names, a.VM) {
			names = append(names, a.VM) // a VM of several attachments once
		}
		if a.VM != vm {
			continue
		}
		ad := AttachmentDescription{AttachmentStatus: a, LogTail: lastLines(sd.HelperLogFile(fmt.Sprintf("%s/%d", a.VM, a.Index)), logTailLines)}
		if ad.Peer == "" {
			ad.Peer = "-"
		}
		if leases != nil {
			for i, l := range leases.Leases {
				if l.Network == a.Network && l.MAC == a.MAC {
					ad.Lease = &leases.Leases[i]
				}
			}
		}
		ad.LastDHCP = lastEvent(sd, func(ev ctlapi.Event) bool {
			return strings.HasPrefix(ev.Kind, "lease-") && ev.Network == a.Network && strings.EqualFold(ev.MAC, a.MAC)
		})
		ad.LastHelperError = lastEvent(sd, func(ev ctlapi.Event) bool {
			return (ev.Kind == "helper-exited" || ev.Kind == "helper-failed") && ev.Attachment == fmt.Sprintf("%s/%d", a.VM, a.Index)
		})
		ad.Advice = advise(ad, st.Controller.Running)
		d.Attachments = append(d.Attachments, ad)
	}
	if len(d.Attachments) == 0 {
		return nil, fmt.Errorf("VM %q is not up in %s; VMs that are up: %v", vm, sd.Path, names)
	}
	return d, nil
}

// advise says what to do about an attachment, if anything.
func advise(a AttachmentDescription, controller bool) []string {
	var out []string
	switch {
	case !controller:
		out = append(out, "no controller runs: DHCP and DNS do not answer; `sudo vmnetctl up` (or the vmnetctl service) starts it")
	case a.State != ctlapi.StateRunning:
		out = append(out, fmt.Sprintf("the helper is %s: see `vmnetctl logs %s`", a.State, a.VM))
	case a.Peer == "waiting for VM" && a.Attach == "vhost-user":
		out = append(out, fmt.Sprintf("no VMM came to the attachment yet: is it running with `vmnetctl args %s --memory SIZE` (its -m)?", a.VM))
	case a.Peer == "waiting for VM":
		out = append(out, fmt.Sprintf("no VMM came to the attachment yet: is it running with `vmnetctl args %s`?", a.VM))
	case a.Peer == "VM gone":
		out = append(out, "the VM's VMM is gone; the helper waits for it to start again")
	case a.Lease == nil && a.IP == "":
		out = append(out, "the VM has no DHCP lease: is DHCP on in the guest for the interface with MAC "+a.MAC+"?")
	}
	for _, m := range a.SeenMACs {
		if !strings.EqualFold(m, a.MAC) {
			out = append(out, fmt.Sprintf("the VM sends from MAC %s, not %s: give its VMM the MAC of `vmnetctl args %s` (its lease, reservation and DNS name key on %s), or set macAddress: %s in the VM's entry", m, a.MAC, a.VM, a.MAC, m))
		}
	}
	if a.SpoofDrops > 0 {
		out = append(out, fmt.Sprintf("the anti-spoofing guard dropped %d frames: does the guest use another MAC or a static address? (docs/security.md; `spoofCheck: false` for a VM that bridges machines of its own)", a.SpoofDrops))
	}
	return out
}

// lastLines returns the last n lines of a file.
func lastLines(path string, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return []string{}
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Render writes the description for people.
func (d *Description) Render(w io.Writer) error {
	for i, a := range d.Attachments {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s/%d on network %s\n", a.VM, a.Index, a.Network)
		row := func(k, v string) {
			if k != "" {
				k += ":"
			}
			fmt.Fprintf(w, "  %-12s %s\n", k, v)
		}
		row("state", a.State)
		if a.Error != "" {
			row("error", a.Error)
		}
		row("MAC", a.MAC)
		where := a.Socket
		if a.Attach == "tap" {
			where = "TAP " + a.Tap + " (opened by the VMM)"
		}
		row("attachment", where)
		if a.Tap != "" {
			row("port", a.Tap)
		}
		row("peer", a.Peer)
		if !a.LastFrameAt.IsZero() {
			row("last frame", a.LastFrameAt.Local().Format("2006-01-02 15:04:05"))
		}
		if len(a.SeenMACs) > 0 {
			row("seen MACs", strings.Join(a.SeenMACs, ", "))
		}
		if a.Lease != nil {
			row("lease", fmt.Sprintf("%s until %s", a.Lease.IP, a.Lease.Expiry.Local().Format("2006-01-02 15:04:05")))
		} else {
			row("lease", "none")
		}
		if a.LastDHCP != nil {
			row("last DHCP", fmt.Sprintf("%s %s at %s", a.LastDHCP.Kind, dash(a.LastDHCP.IP), a.LastDHCP.Time.Local().Format("2006-01-02 15:04:05")))
		} else {
			row("last DHCP", "none")
		}
		if a.LastHelperError != nil {
			row("last error", fmt.Sprintf("%s at %s: %s", a.LastHelperError.Kind, a.LastHelperError.Time.Local().Format("2006-01-02 15:04:05"),
				strings.ReplaceAll(a.LastHelperError.Detail, "\n", "\n                ")))
		}
		if a.PID > 0 {
			row("helper", fmt.Sprintf("pid %d, %d restarts, up %s", a.PID, a.Restarts, roundDur(a.UptimeSeconds)))
		}
		row("traffic", fmt.Sprintf("%d bytes from the VM, %d to it, %d dropped, %d spoofed frames dropped", a.RxBytes, a.TxBytes, a.Drops, a.SpoofDrops))
		for i, f := range a.Forwards {
			k := ""
			if i == 0 {
				k = "forwards"
			}
			row(k, fmt.Sprintf("%s (%d connections)", f.Forward, f.Connections))
		}
		if a.Egress != "" || a.EgressDenied > 0 {
			policy := a.Egress
			if policy == "" {
				policy = "the network's"
			}
			row("egress", fmt.Sprintf("%s; %d connections refused", policy, a.EgressDenied))
		}
		if a.Impair != nil || a.ImpairSetBy != "" {
			row("impair", strings.TrimPrefix(ImpairText(a.AttachmentStatus), "impair "))
		}
		if a.Bandwidth != nil {
			row("bandwidth", a.Bandwidth.String())
		}
		if len(a.LogTail) > 0 {
			fmt.Fprintln(w, "  log:")
			for _, l := range a.LogTail {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
		for _, adv := range a.Advice {
			fmt.Fprintf(w, "  -> %s\n", adv)
		}
	}
	return nil
}
