package controller

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// emit appends an event to the state dir's events log (rotated past
// statedir.MaxEventsLog). Events are best effort: a failed write is logged.
func (c *Controller) emit(ev ctlapi.Event) {
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

// emitFor emits ev with the attachment its network and MAC name. Not
// c.mu: a network's Close, under c.mu, waits for its DHCP server and its
// readers, which may be here.
func (c *Controller) emitFor(ev ctlapi.Event) {
	if d := c.appliedView.Load(); d != nil && ev.MAC != "" {
		for _, a := range d.Attachments {
			if a.Network == ev.Network && strings.EqualFold(a.MAC, ev.MAC) {
				ev.Attachment = a.Key()
			}
		}
	}
	c.emit(ev)
}

// onEgressDenied records a connection a VM opened that an egress policy
// refused (a few a VM: backend.NetworkOptions.OnEgressDenied).
func (c *Controller) onEgressDenied(network string, f backend.DeniedFlow) {
	c.emitFor(ctlapi.Event{Kind: "egress-denied", Network: network, MAC: f.MAC, IP: f.Src.Addr().String(), Detail: f.String()})
}

// onLease is the networks' lease events (backend.NetworkOptions.OnLease),
// with the VM whose attachment has the MAC.
func (c *Controller) onLease(kind, network, mac string, ip netip.Addr) {
	ev := ctlapi.Event{Kind: kind, Network: network, MAC: mac}
	if ip.IsValid() {
		ev.IP = ip.String()
	}
	c.emitFor(ev)
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
	known := map[string]ctlapi.Event{}
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
func (c *Controller) expireLeases(known map[string]ctlapi.Event, now time.Time) (next time.Time) {
	d := c.appliedView.Load()
	if d == nil {
		return time.Time{}
	}
	cur := map[string]ctlapi.Event{}
	for _, n := range d.Networks {
		ls, err := c.be.StoredLeases(n, c.netOpts())
		if err != nil { // unreadable this time: as last time
			for k, ev := range known {
				if ev.Network == n.ID {
					cur[k] = ev
				}
			}
			continue
		}
		for _, l := range ls {
			ev := ctlapi.Event{Time: l.Expiry, Kind: "lease-expired", Network: n.ID, MAC: l.MAC, IP: l.IP.String()}
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
