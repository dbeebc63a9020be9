package spec

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
)

// Action is what a plan does to one network or attachment.
type Action string

const (
	ActionCreate  Action = "create"
	ActionUpdate  Action = "update"  // changed in place: helpers keep running
	ActionReplace Action = "replace" // removed and created again: helpers restart
	ActionDelete  Action = "delete"
)

var actionSigns = map[Action]string{ActionCreate: "+", ActionUpdate: "~", ActionReplace: "-/+", ActionDelete: "-"}

// FieldChange is one field that differs between the current and desired state.
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
	// Replace is set when this change cannot be made in place.
	Replace bool `json:"replace"`
}

// NetworkChange is the plan for one network.
type NetworkChange struct {
	Action  Action        `json:"action"`
	ID      string        `json:"id"`
	Old     *api.Network  `json:"-"`
	New     *api.Network  `json:"-"`
	Changes []FieldChange `json:"changes,omitempty"`
}

// AttachmentChange is the plan for one attachment.
type AttachmentChange struct {
	Action  Action        `json:"action"`
	Key     string        `json:"key"`
	Old     *Attachment   `json:"-"`
	New     *Attachment   `json:"-"`
	Changes []FieldChange `json:"changes,omitempty"`
	// Reason says why an attachment whose own fields are unchanged is replaced.
	Reason string `json:"reason,omitempty"`
}

// Plan is the typed difference between what runs and what should run.
type Plan struct {
	// NetworksFile is set when `up` would record another networks.yaml
	// than the one in force: [from, to].
	NetworksFile []string           `json:"networksFile,omitempty"`
	Networks     []NetworkChange    `json:"networks"`
	Attachments  []AttachmentChange `json:"attachments"`
}

// Empty reports whether the plan changes nothing.
func (p *Plan) Empty() bool {
	return len(p.Networks) == 0 && len(p.Attachments) == 0 && len(p.NetworksFile) == 0
}

// field is a field of a network or attachment that a plan compares.
type field[T any] struct {
	name    string
	get     func(T) string
	replace bool // true when a change needs the object rebuilt
}

// diffFields lists the fields that differ between o and n, and the action:
// create when there is no o, delete when there is no n, else whether the
// changes are an update in place (none is also an update) or need a
// replacement.
func diffFields[E any](fields []field[*E], o, n *E) ([]FieldChange, Action) {
	switch {
	case o == nil:
		return nil, ActionCreate
	case n == nil:
		return nil, ActionDelete
	}
	var changes []FieldChange
	action := ActionUpdate
	for _, f := range fields {
		if ov, nv := f.get(o), f.get(n); ov != nv {
			changes = append(changes, FieldChange{Field: f.name, Old: ov, New: nv, Replace: f.replace})
			if f.replace {
				action = ActionReplace
			}
		}
	}
	return changes, action
}

// networkFields lists what matters in a network. Addresses, mode, MTU and
// isolation shape the bridge and its ports, so changing them replaces the
// network and restarts its helpers; DHCP, DNS and NAT settings are applied
// in place.
var networkFields = []field[*api.Network]{
	{"mode", func(n *api.Network) string { return string(n.Mode) }, true},
	{"subnet", func(n *api.Network) string { return prefixString(n.Subnet) }, true},
	{"gateway", func(n *api.Network) string { return addrString(n.Gateway) }, true},
	// The ports' guards check IPv6 sources against the prefix.
	{"subnet6", func(n *api.Network) string { return prefixString(n.Subnet6) }, true},
	{"interface", func(n *api.Network) string { return n.Interface }, true},
	{"mtu", func(n *api.Network) string { return strconv.Itoa(n.MTU) }, true},
	{"isolation", func(n *api.Network) string { return strconv.FormatBool(n.Isolation) }, true},
	{"offloads", func(n *api.Network) string { return strconv.FormatBool(n.Offloads) }, true},
	{"vmnetBroker", func(n *api.Network) string { return n.VMNetBroker }, true},
	// The tunnel, its peers and each host's DHCP slice.
	{"vxlan", func(n *api.Network) string { return n.VXLAN.String() }, true},
	{"dhcp", func(n *api.Network) string { return strconv.FormatBool(n.DHCP) }, false},
	{"dhcpRange", func(n *api.Network) string {
		if !n.DHCPStart.IsValid() {
			return ""
		}
		return n.DHCPStart.String() + "-" + n.DHCPEnd.String()
	}, false},
	{"leaseTime", func(n *api.Network) string { return n.LeaseTime.String() }, false},
	{"reservations", func(n *api.Network) string {
		var parts []string
		for _, r := range n.Reservations {
			parts = append(parts, r.MAC+"="+r.IP.String())
		}
		return strings.Join(parts, ",")
	}, false},
	{"dnsProxy", func(n *api.Network) string { return strconv.FormatBool(n.DNSProxy) }, false},
	{"nat44", func(n *api.Network) string { return strconv.FormatBool(n.NAT44) }, false},
	{"nat66", func(n *api.Network) string { return strconv.FormatBool(n.NAT66) }, false},
	{"routerAdvertisement", func(n *api.Network) string { return strconv.FormatBool(n.RouterAdvertisement) }, false},
	{"egress", func(n *api.Network) string { return n.Egress.String() }, false},
	{"partitions", func(n *api.Network) string { return n.Partitions.String() }, false},
}

// attachmentFields: a new network, MAC, kind of attachment or guard needs
// a new helper; a fixed address is a DHCP reservation, changed in place.
var attachmentFields = []field[*Attachment]{
	{"network", func(a *Attachment) string { return a.Network }, true},
	{"mac", func(a *Attachment) string { return a.MAC }, true},
	{"attach", func(a *Attachment) string { return string(a.Attach) }, true},
	{"spoofCheck", func(a *Attachment) string { return strconv.FormatBool(a.SpoofCheck()) }, true},
	{"ip", func(a *Attachment) string { return addrString(a.IP) }, false},
	{"project", func(a *Attachment) string { return a.Project }, false},
	{"interface", func(a *Attachment) string { return a.Interface }, false},
	{"metric", func(a *Attachment) string { return strconv.Itoa(a.Metric) }, false},
	{"egress", func(a *Attachment) string { return a.Egress.String() }, false},
	{"bandwidth", func(a *Attachment) string { return a.Bandwidth.String() }, false},
	{"impair", func(a *Attachment) string { return a.Impair.String() }, false},
	{"portForwards", func(a *Attachment) string {
		var parts []string
		for _, f := range a.PortForwards {
			parts = append(parts, f.String())
		}
		return strings.Join(parts, ", ")
	}, false},
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// ComputePlan compares the current state (what was applied and still runs;
// nil for nothing) with the desired one.
func ComputePlan(current, desired *Desired) *Plan {
	if current == nil {
		current = &Desired{}
	}
	p := &Plan{}
	replaced := map[string]bool{} // networks being rebuilt
	networkID := func(n *api.Network) string { return n.ID }
	oldNets, newNets := byKey(current.Networks, networkID), byKey(desired.Networks, networkID)
	for _, id := range sortedKeys(oldNets, newNets) {
		o, n := oldNets[id], newNets[id]
		changes, action := diffFields(networkFields, o, n)
		if action == ActionDelete || action == ActionReplace {
			replaced[id] = true
		}
		if action != ActionUpdate || len(changes) > 0 {
			p.Networks = append(p.Networks, NetworkChange{Action: action, ID: id, Old: o, New: n, Changes: changes})
		}
	}

	pair := func(key string, o, n *Attachment) {
		changes, action := diffFields(attachmentFields, o, n)
		reason := ""
		if action == ActionUpdate && replaced[n.Network] {
			action, reason = ActionReplace, fmt.Sprintf("network %s is replaced", n.Network)
		}
		if action != ActionUpdate || len(changes) > 0 {
			p.Attachments = append(p.Attachments, AttachmentChange{Action: action, Key: key, Old: o, New: n, Changes: changes, Reason: reason})
		}
	}
	if slices.IsSortedFunc(current.Attachments, attachmentOrder) && slices.IsSortedFunc(desired.Attachments, attachmentOrder) {
		// Both in Resolve's order (a pass's desired state, and the last
		// one's): walked side by side, with no map or sort of the
		// fleet's keys, and the few changes put in the keys' order.
		olds, news := current.Attachments, desired.Attachments
		for len(olds) > 0 || len(news) > 0 {
			switch c := compareFirst(olds, news); {
			case c < 0:
				pair(olds[0].Key(), olds[0], nil)
				olds = olds[1:]
			case c > 0:
				pair(news[0].Key(), nil, news[0])
				news = news[1:]
			default:
				// The same attachment (a project that did not change:
				// spec.Resolver gives its attachments again, and no one
				// writes into a Desired's) is unchanged but where its
				// network is replaced.
				if olds[0] != news[0] || replaced[news[0].Network] {
					pair(news[0].Key(), olds[0], news[0])
				}
				olds, news = olds[1:], news[1:]
			}
		}
		slices.SortFunc(p.Attachments, func(a, b AttachmentChange) int { return cmp.Compare(a.Key, b.Key) })
		return p
	}
	oldAtts, newAtts := byKey(current.Attachments, (*Attachment).Key), byKey(desired.Attachments, (*Attachment).Key)
	for _, key := range sortedKeys(oldAtts, newAtts) {
		pair(key, oldAtts[key], newAtts[key])
	}
	return p
}

// attachmentOrder is Resolve's order of a desired state's attachments:
// by VM, then entry.
func attachmentOrder(a, b *Attachment) int {
	return cmp.Or(cmp.Compare(a.VM, b.VM), cmp.Compare(a.Index, b.Index))
}

// compareFirst compares the first of olds and news in attachmentOrder;
// an empty list's first comes after any other's.
func compareFirst(olds, news []*Attachment) int {
	switch {
	case len(olds) == 0:
		return 1
	case len(news) == 0:
		return -1
	}
	return attachmentOrder(olds[0], news[0])
}

// byKey indexes items by key(item).
func byKey[V any](items []V, key func(V) string) map[string]V {
	m := make(map[string]V, len(items))
	for _, v := range items {
		m[key(v)] = v
	}
	return m
}

func sortedKeys[V any](ms ...map[string]V) []string {
	all := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			all[k] = true
		}
	}
	return slices.Sorted(maps.Keys(all))
}

// Summary is the plan's closing line.
func (p *Plan) Summary() string {
	if p.Empty() {
		return "No changes."
	}
	count := map[Action]int{}
	for _, c := range p.Networks {
		count[c.Action]++
	}
	for _, c := range p.Attachments {
		count[c.Action]++
	}
	if len(p.Networks) == 0 && len(p.Attachments) == 0 {
		return "Plan: the networks.yaml in force changes; nothing else."
	}
	return fmt.Sprintf("Plan: %d to create, %d to change, %d to replace, %d to delete.",
		count[ActionCreate], count[ActionUpdate], count[ActionReplace], count[ActionDelete])
}

// Render writes the plan as a readable diff.
func (p *Plan) Render(w io.Writer) error {
	if p.Empty() {
		_, err := fmt.Fprintln(w, p.Summary())
		return err
	}
	if len(p.NetworksFile) == 2 {
		fmt.Fprintf(w, "networks.yaml: %s -> %s\n", p.NetworksFile[0], p.NetworksFile[1])
	}
	if len(p.Networks) > 0 {
		fmt.Fprintln(w, "Networks:")
		for _, c := range p.Networks {
			desc := ""
			if n := cmp.Or(c.New, c.Old); c.Action == ActionCreate || c.Action == ActionDelete {
				desc = DescribeNetwork(n)
				if n.Egress != nil {
					desc += ", egress " + n.Egress.String()
				}
			}
			renderChange(w, c.Action, c.ID, desc, "", c.Changes)
		}
	}
	if len(p.Attachments) > 0 {
		fmt.Fprintln(w, "Attachments:")
		for _, c := range p.Attachments {
			desc := ""
			if a := cmp.Or(c.New, c.Old); c.Action == ActionCreate || c.Action == ActionDelete {
				desc = describeAttachment(a)
			}
			renderChange(w, c.Action, c.Key, desc, c.Reason, c.Changes)
		}
	}
	_, err := fmt.Fprintln(w, p.Summary())
	return err
}

// renderChange writes one line of the plan: a created or deleted object with
// its description, or a changed one with its reason and changed fields.
func renderChange(w io.Writer, action Action, name, desc, reason string, changes []FieldChange) {
	switch {
	case desc != "":
		fmt.Fprintf(w, "  %-3s %s: %s\n", actionSigns[action], name, desc)
		return
	case reason != "":
		fmt.Fprintf(w, "  %-3s %s (%s)\n", actionSigns[action], name, reason)
	default:
		fmt.Fprintf(w, "  %-3s %s\n", actionSigns[action], name)
	}
	renderChanges(w, changes)
}

func renderChanges(w io.Writer, changes []FieldChange) {
	for _, ch := range changes {
		note := ""
		if ch.Replace {
			note = "  (forces replacement)"
		}
		fmt.Fprintf(w, "        %s: %s -> %s%s\n", ch.Field, quoteEmpty(ch.Old), quoteEmpty(ch.New), note)
	}
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func DescribeNetwork(n *api.Network) string {
	if n.Mode == api.ModeBridged {
		return fmt.Sprintf("bridged onto %s", n.Interface)
	}
	return fmt.Sprintf("%s %s, gateway %s, bridge %s", n.Mode, n.Subnet, n.Gateway, n.Bridge())
}

func describeAttachment(a *Attachment) string {
	s := fmt.Sprintf("%s on %s, %s, %s", a.VM, a.Network, a.MAC, a.Attach)
	if a.IP.IsValid() {
		s += ", ip " + a.IP.String()
	}
	for _, f := range a.PortForwards {
		s += ", forward " + f.String()
	}
	if a.Egress != nil {
		s += ", egress " + a.Egress.String()
	}
	return s
}
