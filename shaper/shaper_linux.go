package shaper

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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
	cur, err := rootTbf(l)
	if err != nil {
		return err
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
	in, err := qdiscAt(l, netlink.HANDLE_INGRESS)
	if err != nil {
		return fail(err)
	}
	if in.kind != "ingress" {
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
	in, err := qdiscAt(l, netlink.HANDLE_INGRESS)
	if err != nil || in.kind != "ingress" {
		return err
	}
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: in.handle, Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing the bandwidth limit from the VM on %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// qdisc is what qdiscAt reads of a qdisc: its kind ("" for none), its
// handle and, of a token bucket, its parameters.
type qdisc struct {
	kind   string
	handle uint32
	tbf    *netlink.Tbf
}

// qdiscAt is l's qdisc at parent (netlink.HANDLE_ROOT or HANDLE_INGRESS),
// asked of the kernel for that one qdisc: netlink.QdiscList dumps every
// qdisc of the namespace and keeps l's, a cost that grows with the ports
// (a controller's first pass sets every port's limits: at 10,000 ports
// it took 10,000 dumps of 10,000 qdiscs, twice). The kernel (6.18 here)
// sends the qdisc asked for only to a request that asks for an echo (it
// goes to the tc group's listeners too), and nothing for the noop qdisc
// an ingress leaves once removed: the request asks for an
// acknowledgement too, which ends the answer either way.
func qdiscAt(l netlink.Link, parent uint32) (qdisc, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETQDISC, unix.NLM_F_ECHO|unix.NLM_F_ACK)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(l.Attrs().Index), Parent: parent})
	var q qdisc
	var perr error
	err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWQDISC, func(m []byte) bool {
		if len(m) < nl.SizeofTcMsg {
			return true
		}
		msg := nl.DeserializeTcMsg(m)
		if msg.Parent != parent {
			return true // (the kernel's noop qdisc of a device without one)
		}
		q.handle = msg.Handle
		for typ, v := range hostnet.Attrs(m[nl.SizeofTcMsg:]) {
			switch typ & nl.NLA_TYPE_MASK {
			case nl.TCA_KIND:
				q.kind = unix.ByteSliceToString(v)
			case nl.TCA_OPTIONS:
				q.tbf, perr = tbfOptions(v)
			}
		}
		return true
	})
	if errors.Is(err, unix.ENOENT) {
		return qdisc{}, nil // none there
	}
	if err != nil {
		return qdisc{}, fmt.Errorf("the qdisc of %s: %w", l.Attrs().Name, err)
	}
	if q.kind != "tbf" {
		q.tbf = nil
	} else if perr != nil || q.tbf == nil {
		return qdisc{}, fmt.Errorf("the token bucket of %s: unreadable parameters", l.Attrs().Name)
	}
	return q, nil
}

// tbfOptions reads a token bucket's TCA_OPTIONS as netlink.QdiscList
// does (its rate, limit and buffer: what setTbf compares); nil if they
// are not a token bucket's.
func tbfOptions(b []byte) (*netlink.Tbf, error) {
	t := &netlink.Tbf{}
	parms := false
	for typ, v := range hostnet.Attrs(b) {
		switch typ & nl.NLA_TYPE_MASK {
		case nl.TCA_TBF_PARMS:
			if len(v) < nl.SizeofTcTbfQopt {
				return nil, errors.New("short parameters")
			}
			o := nl.DeserializeTcTbfQopt(v)
			t.Rate, t.Limit, t.Buffer = uint64(o.Rate.Rate), o.Limit, o.Buffer
			parms = true
		case nl.TCA_TBF_RATE64:
			if len(v) < 8 {
				return nil, errors.New("short rate")
			}
			t.Rate = nl.NativeEndian().Uint64(v)
		}
	}
	if !parms {
		return nil, errors.New("no parameters")
	}
	return t, nil
}

// rootTbf is l's root qdisc if it is a token bucket, or nil.
func rootTbf(l netlink.Link) (*netlink.Tbf, error) {
	q, err := qdiscAt(l, netlink.HANDLE_ROOT)
	if err != nil || q.tbf == nil {
		return nil, err
	}
	t := q.tbf
	t.QdiscAttrs = netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: q.handle, Parent: netlink.HANDLE_ROOT}
	return t, nil
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
		t, err := rootTbf(l)
		if err != nil {
			return nil, err
		}
		if t != nil {
			*dev.rate = t.Rate * 8
			if b.Burst == 0 {
				b.Burst = uint64(netlink.Xmitsize(t.Rate, t.Buffer))
			}
		}
	}
	if b.ToVM == 0 && b.FromVM == 0 {
		return nil, nil
	}
	return b, nil
}
