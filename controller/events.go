package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// Event is one thing that happened, as `vmnetctl events` shows it. Kinds:
// network-up, network-removed, drift-found, drift-repaired,
// helper-started, helper-exited, helper-failed, lease-granted,
// lease-released, lease-declined, lease-expired.
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
	if kind == "lease-granted" {
		select { // watchLeaseExpiry learns the lease's expiry
		case c.leaseKick <- struct{}{}:
		default:
		}
	}
}

// watchLeaseExpiry emits lease-expired for each lease of the applied
// networks that expires without being renewed or released. The DHCP
// server does not notice expiry (an expired lease is only free for
// reuse), so this compares the lease files between passes: one at each
// lease's expiry, after a lease is granted, and at least every resync.
func (c *Controller) watchLeaseExpiry(ctx context.Context) {
	known := map[string]Event{}
	for {
		next := c.expireLeases(known, time.Now())
		wait := c.opts.Resync
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0)+50*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-c.leaseKick:
		case <-time.After(wait):
		}
	}
}

// expireLeases is one pass of watchLeaseExpiry: known holds the leases of
// the last pass by network/MAC, with their expiry in Time; a lease gone
// since, past its expiry, expired (one gone before its expiry was released
// or its network removed: not an event). It returns the next expiry.
func (c *Controller) expireLeases(known map[string]Event, now time.Time) (next time.Time) {
	d := c.appliedView.Load()
	if d == nil {
		return time.Time{}
	}
	cur := map[string]Event{}
	for _, n := range d.Networks {
		ls, err := leasesOf(c.be, c.sd, n)
		if err != nil { // unreadable this time: as last time
			for k, ev := range known {
				if ev.Network == n.ID {
					cur[k] = ev
				}
			}
			continue
		}
		for _, l := range ls {
			ev := Event{Time: l.Expiry, Kind: "lease-expired", Network: n.ID, MAC: l.MAC, IP: l.IP.String()}
			for _, a := range d.Attachments {
				if a.Network == n.ID && strings.EqualFold(a.MAC, l.MAC) {
					ev.Attachment = a.Key()
				}
			}
			cur[n.ID+"/"+strings.ToLower(l.MAC)] = ev
		}
	}
	for k, ev := range known {
		if _, ok := cur[k]; !ok && !now.Before(ev.Time) {
			ev.Detail = "expired at " + ev.Time.Format(time.RFC3339)
			c.emit(ev)
		}
	}
	clear(known)
	for k, ev := range cur {
		known[k] = ev
		if next.IsZero() || ev.Time.Before(next) {
			next = ev.Time
		}
	}
	return next
}

// lastEvent returns the last event of the state dir's events log that
// match accepts, or nil.
func lastEvent(sd statedir.Dir, match func(Event) bool) *Event {
	b, err := os.ReadFile(sd.EventsLog())
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var ev Event
		if json.Unmarshal([]byte(lines[i]), &ev) == nil && match(ev) {
			return &ev
		}
	}
	return nil
}

// Events writes the state dir's events to w, as lines for people or (with
// asJSON) one JSON object per line; with follow it then writes new ones as
// they come until ctx ends.
func Events(ctx context.Context, sd statedir.Dir, asJSON, follow bool, w io.Writer) error {
	return EventsTail(ctx, sd, TailOptions{JSON: asJSON, Follow: follow}, w)
}

// ParseSince is `--since`: "" for none, a duration before now (10m), or a
// time (RFC 3339).
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q is neither a duration (10m, 2h) nor a time (2026-12-05T08:00:00Z)", s)
}

// EventsTail is Events with TailOptions: the last o.Tail events, those
// since o.Since.
func EventsTail(ctx context.Context, sd statedir.Dir, o TailOptions, w io.Writer) error {
	src := &logSource{path: sd.EventsLog()}
	out := w
	if !o.JSON {
		out = &eventPrinter{w: w}
	}
	var keep func([]byte) bool
	if !o.Since.IsZero() {
		keep = func(line []byte) bool {
			var ev Event
			return json.Unmarshal(line, &ev) == nil && !ev.Time.Before(o.Since)
		}
	}
	return tailWith(ctx, []*logSource{src}, out, o, keep)
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
