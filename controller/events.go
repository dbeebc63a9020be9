package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// Event is one thing that happened, as `vmnetctl events` shows it. Kinds:
// network-up, network-removed, drift-found, drift-repaired,
// helper-started, helper-exited, helper-failed, lease-granted,
// lease-released, lease-declined.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Network string    `json:"network,omitempty"`
	// Attachment is VM/INDEX.
	Attachment string `json:"attachment,omitempty"`
	MAC        string `json:"mac,omitempty"`
	IP         string `json:"ip,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// emit appends an event to the state dir's events log (rotated past
// statedir.MaxEventsLog). Events are best effort: a failed write is logged.
func (c *Controller) emit(ev Event) {
	ev.Time = time.Now()
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	c.eventsMu.Lock()
	defer c.eventsMu.Unlock()
	path := c.sd.EventsLog()
	statedir.RotateLog(path, statedir.MaxEventsLog)
	f, err := statedir.OpenLog(path)
	if err != nil {
		c.log.Warn("writing an event", "err", err)
		return
	}
	defer f.Close()
	f.Write(append(b, '\n'))
}

// onLease is the networks' lease events (backend.NetworkOptions.OnLease),
// with the VM whose attachment has the MAC.
func (c *Controller) onLease(kind, network, mac string, ip netip.Addr) {
	ev := Event{Kind: kind, Network: network, MAC: mac}
	if ip.IsValid() {
		ev.IP = ip.String()
	}
	// Not c.mu: a network's Close, under c.mu, waits for its DHCP server,
	// which may be here.
	if d := c.appliedView.Load(); d != nil {
		for _, a := range d.Attachments {
			if a.Network == network && strings.EqualFold(a.MAC, mac) {
				ev.Attachment = a.Key()
			}
		}
	}
	c.emit(ev)
}

// Events writes the state dir's events to w, as lines for people or (with
// asJSON) one JSON object per line; with follow it then writes new ones as
// they come until ctx ends.
func Events(ctx context.Context, sd statedir.Dir, asJSON, follow bool, w io.Writer) error {
	src := &logSource{path: sd.EventsLog()}
	out := w
	if !asJSON {
		out = &eventPrinter{w: w}
	}
	return tailSources(ctx, []*logSource{src}, out, follow)
}

// eventPrinter turns JSON event lines into lines for people.
type eventPrinter struct{ w io.Writer }

func (p *eventPrinter) Write(b []byte) (int, error) {
	var ev Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return len(b), nil // not an event: skipped
	}
	subject := ev.Attachment
	if subject == "" {
		subject = ev.Network
	} else if ev.Network != "" {
		subject += " on " + ev.Network
	}
	var extra []string
	for _, kv := range [][2]string{{"mac", ev.MAC}, {"ip", ev.IP}, {"pid", pidString(ev.PID)}} {
		if kv[1] != "" {
			extra = append(extra, kv[0]+"="+kv[1])
		}
	}
	if ev.Detail != "" {
		extra = append(extra, ev.Detail)
	}
	_, err := fmt.Fprintf(p.w, "%s %-16s %s %s\n", ev.Time.Local().Format("2006-01-02 15:04:05.000"), ev.Kind, subject, strings.Join(extra, " "))
	return len(b), err
}

func pidString(pid int) string {
	if pid == 0 {
		return ""
	}
	return fmt.Sprint(pid)
}
