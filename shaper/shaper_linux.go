package shaper

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// queueLatency is how long a frame to the VM may wait in the token
// bucket's queue before it is dropped: what the queue holds beyond the
// burst (tc's `latency`).
const queueLatency = 50e-3

// ingressHandle is the ingress qdisc's handle (ffff:), redirectPriority
// the priority of the filter on it that sends what the VM sends to its
// IFB device.
var ingressHandle = netlink.MakeHandle(0xffff, 0)

const redirectPriority = 1

// Set makes link name's limits b (nil: none): a token bucket filter at
// the root of what the link sends (to the VM) for b.ToVM; for b.FromVM,
// what the VM sends is redirected from the link's ingress to an IFB
// device of its own (api.ShaperName, marked hostnet.ShaperMark), whose
// token bucket holds it to the rate. (A policer would do without the
// IFB device, but drops what a queue would delay, and this kernel has
// none: CONFIG_NET_ACT_POLICE is off here, as on many.)
// What the kernel holds already as wanted is left alone; what differs is
// replaced, and a limit no longer wanted is removed. It is the link's
// only writer of these (the link is vmnetctl's), so it puts back what
// changed behind its back.
func Set(name string, b *api.Bandwidth) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("bandwidth of %s: %w", name, err)
	}
	if b == nil {
		b = &api.Bandwidth{}
	}
	return errors.Join(setToVM(l, b), setFromVM(l, b))
}

// setToVM makes l's root qdisc the token bucket of b.ToVM, or removes
// the one vmnetctl set.
func setToVM(l netlink.Link, b *api.Bandwidth) error {
	if err := setTbf(l, b.ToVM, b); err != nil {
		return fmt.Errorf("the bandwidth to the VM on %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// setTbf makes l's root qdisc a token bucket of rate bits a second (b's
// burst), or, for 0, removes the one there.
func setTbf(l netlink.Link, rate uint64, b *api.Bandwidth) error {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return err
	}
	var cur *netlink.Tbf
	for _, q := range qs {
		if t, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
			cur = t
		}
	}
	if rate == 0 {
		if cur == nil {
			return nil
		}
		return netlink.QdiscDel(cur)
	}
	want := tbf(l.Attrs().Index, rate, b)
	if cur != nil && cur.Rate == want.Rate && cur.Buffer == want.Buffer && cur.Limit == want.Limit {
		return nil
	}
	return netlink.QdiscReplace(want)
}

// tbf is the token bucket filter of rate bits a second, with b's burst,
// on link index.
func tbf(index int, rate uint64, b *api.Bandwidth) *netlink.Tbf {
	bytes := rate / 8 // a second
	burst := b.BurstFor(rate)
	limit := min(uint64(float64(bytes)*queueLatency)+burst, math.MaxUint32)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bytes,
		Limit:      uint32(limit),
		Buffer:     netlink.Xmittime(bytes, uint32(burst)),
	}
}

// setFromVM redirects what the VM sends on l to l's IFB device and
// shapes it there to b.FromVM, or removes the redirect and the device.
func setFromVM(l netlink.Link, b *api.Bandwidth) error {
	name := l.Attrs().Name
	if b.FromVM == 0 {
		return errors.Join(removeIngress(l), Remove(name))
	}
	fail := func(err error) error {
		return fmt.Errorf("limiting the bandwidth from the VM on %s to %s: %w", name, api.FormatRate(b.FromVM), err)
	}
	ifb, err := ensureIFB(name)
	if err != nil {
		return fail(err)
	}
	if err := setTbf(ifb, b.FromVM, b); err != nil {
		return fail(err)
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return fail(err)
	}
	if !slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Attrs().Parent == netlink.HANDLE_INGRESS }) {
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
		if err := netlink.QdiscAdd(q); err != nil {
			return fail(err)
		}
	}
	fs, err := netlink.FilterList(l, ingressHandle)
	if err != nil {
		return fail(err)
	}
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok || u.Priority != redirectPriority {
			continue
		}
		if redirectsTo(u) == ifb.Attrs().Index {
			return nil
		}
		// A redirect to an IFB device that is gone (deleted behind
		// vmnetctl's back, made again): the kernel drops what it
		// redirects there, so it goes before the new one is added.
		if err := netlink.FilterDel(f); err != nil {
			return fail(err)
		}
	}
	redirect := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: ingressHandle, Priority: redirectPriority, Protocol: unix.ETH_P_ALL},
		RedirIndex:  ifb.Attrs().Index, // every frame (no key: u32 matches all)
	}
	if err := netlink.FilterReplace(redirect); err != nil {
		return fail(err)
	}
	return nil
}

// redirectsTo is the ifindex filter u redirects to, 0 for none.
func redirectsTo(u *netlink.U32) int {
	if u.RedirIndex != 0 {
		return u.RedirIndex
	}
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR {
			return m.Ifindex
		}
	}
	return 0
}

// removeIngress removes l's ingress qdisc (and the redirect on it).
func removeIngress(l netlink.Link) error {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_INGRESS {
			if err := netlink.QdiscDel(q); err != nil {
				return fmt.Errorf("removing the bandwidth limit from the VM on %s: %w", l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// ensureIFB returns port's IFB device, made (marked, up) if missing. One
// of that name that is not marked as port's is not touched.
func ensureIFB(port string) (netlink.Link, error) {
	name := api.ShaperName(port)
	l, err := netlink.LinkByName(name)
	if err == nil {
		if l.Attrs().Alias != hostnet.ShaperMark(port) {
			return nil, fmt.Errorf("%s exists and is not vmnetctl's IFB device of %s (its alias is %q)", name, port, l.Attrs().Alias)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(l); err != nil { // (set down behind vmnetctl's back)
				return nil, err
			}
		}
		return l, nil
	}
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, err
	}
	if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		return nil, fmt.Errorf("making %s: %w", name, err)
	}
	if l, err = netlink.LinkByName(name); err == nil {
		if err = netlink.LinkSetAlias(l, hostnet.ShaperMark(port)); err == nil {
			err = netlink.LinkSetUp(l)
		}
	}
	if err != nil {
		netlink.LinkDel(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name}})
		return nil, fmt.Errorf("making %s: %w", name, err)
	}
	return l, nil
}

// Remove deletes port's IFB device, if it has one (the port's limit from
// the VM goes with it): when the port goes, or its limit.
func Remove(port string) error {
	l, err := netlink.LinkByName(api.ShaperName(port))
	if err != nil || l.Attrs().Alias != hostnet.ShaperMark(port) {
		return nil // none, or not ours
	}
	if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return fmt.Errorf("removing %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// SweepStrays deletes the IFB devices of this process's owner
// (hostnet.Owner) whose ports are gone: left by a controller that died
// between a helper's stop and its cleanup.
func SweepStrays() error {
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		alias := l.Attrs().Alias
		rest, ok := strings.CutPrefix(alias, hostnet.ShaperMarkPrefix)
		if !ok || !hostnet.Mine(alias) {
			continue
		}
		port, _, _ := strings.Cut(rest, hostnet.OwnerSep)
		if _, err := netlink.LinkByName(port); err == nil {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Get reads the limits the kernel holds on link name (nil: none), as
// Set gave them: rates in bits a second, and the burst of the first.
func Get(name string) (*api.Bandwidth, error) {
	b := &api.Bandwidth{}
	for _, dev := range []struct {
		name string
		rate *uint64
	}{{name, &b.ToVM}, {api.ShaperName(name), &b.FromVM}} {
		l, err := netlink.LinkByName(dev.name)
		if err != nil {
			if dev.name == name {
				return nil, err
			}
			continue
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return nil, err
		}
		for _, q := range qs {
			if t, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
				*dev.rate = t.Rate * 8
				if b.Burst == 0 {
					b.Burst = uint64(netlink.Xmitsize(t.Rate, t.Buffer))
				}
			}
		}
	}
	if b.ToVM == 0 && b.FromVM == 0 {
		return nil, nil
	}
	return b, nil
}
