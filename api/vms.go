package api

import (
	"cmp"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// RefKind is the key a VM file's network entry uses to name its network.
type RefKind string

const (
	// RefVMNet is `- vmnet: NAME` (lima's newer form).
	RefVMNet RefKind = "vmnet"
	// RefLima is `- lima: NAME` (lima's socket_vmnet form).
	RefLima RefKind = "lima"
)

// AttachKind is how the VM process is connected to its network.
type AttachKind string

const (
	// AttachSocket connects the VM through a unix datagram socket served by a helper.
	AttachSocket AttachKind = "socket"
	// AttachTAP hands the VM a TAP device that it opens itself.
	AttachTAP AttachKind = "tap"
	// AttachStream connects the VM through a unix stream socket served by
	// a helper, each frame a 4-byte big-endian length and the frame: what
	// qemu's -netdev stream and lima's `socket:` networks connect to.
	AttachStream AttachKind = "stream"
	// AttachVhostUser connects the VM through vhost-user (qemu -netdev
	// vhost-user, cloud-hypervisor vhost_user=true): the helper serves a
	// unix stream socket, maps the guest's memory the VMM shares and moves
	// frames between its rings and the TAP itself. Linux only.
	AttachVhostUser AttachKind = "vhost-user"
)

// Default values for a VM file's network entries, as lima has them.
const DefaultMetric = 100

// VM file shapes.
const (
	ShapeLima = "lima" // a lima instance file: top-level `networks:` list
	ShapeVMs  = "vms"  // vmnetctl's multi-VM file: top-level `vms:` map
)

// Attachment is one VM's connection to one network: one helper process.
type Attachment struct {
	VM    string  `json:"vm"`
	Index int     `json:"index"`
	Ref   RefKind `json:"ref"`
	// NetworkRef is the network name as written; Network is the resolved ID.
	NetworkRef string     `json:"networkRef"`
	Network    string     `json:"network"`
	MAC        string     `json:"mac"`
	MACDerived bool       `json:"macDerived"`
	Interface  string     `json:"interface"`
	Metric     int        `json:"metric"`
	IP         netip.Addr `json:"ip,omitzero"`
	Attach     AttachKind `json:"attach"`
	// NoSpoofCheck is `spoofCheck: false`: the port is not guarded (for a
	// VM that bridges machines of its own, whose frames carry their MACs).
	NoSpoofCheck bool `json:"noSpoofCheck,omitempty"`
	// PortForwards expose ports of the VM on the host (shared and host
	// networks).
	PortForwards []PortForward `json:"portForwards,omitempty"`
	// Egress, if set, is the VM's own egress policy on the network, in
	// place of the network's (without names: those are the network's).
	Egress *Egress `json:"egress,omitempty"`
	// Bandwidth, if set, limits what the VM is sent and may send.
	Bandwidth *Bandwidth `json:"bandwidth,omitempty"`
	// Impair is what the attachment's link does to its frames on
	// purpose (`impair`); nil for nothing.
	Impair *Impairment `json:"impair,omitempty"`
	Source Source      `json:"source"`

	lines map[string]int
	path  string
	// key is Key, made as the entry is read: VM and Index do not change
	// after.
	key string
	// firstMAC and legacyMAC are, for an entry whose MAC vmnetctl
	// derives, deriveMAC's first try and LegacyMAC: each a hash, taken
	// once when its file is read (Resolve asks of every attachment on
	// every pass whether the MAC it runs with is one of its own).
	firstMAC, legacyMAC string
}

// derivedMACs are a's first derived MAC and its legacy one, as text.
func (a *Attachment) derivedMACs() (first, legacy string) {
	if a.firstMAC == "" {
		a.firstMAC, a.legacyMAC = deriveMAC(a.VM, a.Index, 0).String(), LegacyMAC(a.VM, a.Index).String()
	}
	return a.firstMAC, a.legacyMAC
}

// PinnedMAC is the MAC the VM file sets, the only one the anti-spoofing
// guard lets the VM send from; "" when vmnetctl derived the MAC (the VM
// may then use another, and the guard keeps the first it uses).
func (a *Attachment) PinnedMAC() string {
	if a.MACDerived {
		return ""
	}
	return a.MAC
}

// SpoofCheck reports whether the attachment's port is guarded against
// spoofing (the default; `spoofCheck: false` opts out).
func (a *Attachment) SpoofCheck() bool { return !a.NoSpoofCheck }

// Key identifies an attachment: its VM and its position in the VM's list
// ("vm/0"). A pass asks it of every attachment several times: an entry
// read from a file has it made once, as it is read (and its clones copy
// it); others make it, one allocation (fmt.Sprintf was 5% of an attach's
// CPU at 1,000 VMs).
func (a *Attachment) Key() string {
	if a.key != "" {
		return a.key
	}
	return a.VM + "/" + strconv.Itoa(a.Index)
}

// Skipped is a network entry that vmnetctl leaves to someone else.
type Skipped struct {
	Index  int    `json:"index"`
	Entry  string `json:"entry"`
	Reason string `json:"reason"`
	Source Source `json:"source"`
}

// VM is a virtual machine and its network entries.
type VM struct {
	Name        string        `json:"name"`
	Attachments []*Attachment `json:"attachments"`
	Skipped     []Skipped     `json:"skipped,omitempty"`
	Source      Source        `json:"source"`

	path string // its field in the file ("vms.NAME"; "" for a lima file)
}

// VMFile is a loaded VM file.
type VMFile struct {
	File  string `json:"file"`
	Shape string `json:"shape"`
	VMs   []*VM  `json:"vms"`
}

// Clone is a copy of f that Resolve may change without changing f: its
// VMs, their entries and their lists are copies (what Resolve writes);
// what Resolve only reads (forwards, egress) is shared.
func (f *VMFile) Clone() *VMFile {
	// In a few slabs rather than an allocation per VM and per entry: the
	// controller clones a fleet's files on every pass. A file of one VM
	// of one entry (a project a VM, as a fleet attached through the API
	// is) in one.
	n := 0
	for _, vm := range f.VMs {
		n += len(vm.Attachments)
	}
	if len(f.VMs) == 1 && n == 1 {
		one := &oneVMFile{file: *f, vm: *f.VMs[0], att: *f.VMs[0].Attachments[0]}
		one.attPtr[0] = &one.att
		one.vm.Attachments = one.attPtr[:]
		one.vm.Skipped = slices.Clone(f.VMs[0].Skipped)
		one.vmPtr[0] = &one.vm
		one.file.VMs = one.vmPtr[:]
		return &one.file
	}
	c := *f
	vms, ptrs := make([]VM, len(f.VMs)), make([]*VM, len(f.VMs))
	atts, aptrs := make([]Attachment, 0, n), make([]*Attachment, 0, n)
	for i, vm := range f.VMs {
		vms[i] = *vm
		v := &vms[i]
		first := len(aptrs)
		for _, a := range vm.Attachments {
			atts = append(atts, *a)
			aptrs = append(aptrs, &atts[len(atts)-1])
		}
		v.Attachments = aptrs[first:len(aptrs):len(aptrs)]
		v.Skipped = slices.Clone(vm.Skipped)
		ptrs[i] = v
	}
	c.VMs = ptrs
	return &c
}

// oneVMFile is a clone of a file of one VM of one entry, in one
// allocation.
type oneVMFile struct {
	file   VMFile
	vm     VM
	vmPtr  [1]*VM
	att    Attachment
	attPtr [1]*Attachment
}

// VMFileOptions changes how a VM file is read.
type VMFileOptions struct {
	// Name is the VM's name for a lima instance file; by default the name of
	// the file's directory, as lima's ~/.lima/NAME/lima.yaml.
	Name string
	// Abs is the file's absolute path, when file is relative to a directory
	// other than this process's (a project recorded by the command that
	// read it, parsed again by the controller): the default name comes
	// from it.
	Abs string
}

// MaxPortsPerNetwork bounds the attachments of one shared or host network
// on a host: the kernel's bridge takes at most 1023 ports, and a network's
// bridge may have a tunnel's port too.
const MaxPortsPerNetwork = 1000

// MaxAttachments bounds the attachments of a state dir's VM files: each
// is a helper process of several threads, and a host (or its cgroup) runs
// so many tasks; past this, up is refused before anything changes rather
// than failing half-way as processes can no longer start.
const MaxAttachments = 10000

var entryKeys = []string{"lima", "vmnet", "socket", "vzNAT", "vnl", "switchPort", "macAddress", "interface", "metric", "ip", "attach", "spoofCheck", "portForwards", "egress", "bandwidth", "impair"}

// LoadVMFile parses a lima instance file or a multi-VM file. When there are
// errors the result holds what could be read (entries with errors left out),
// so that Resolve can still report the rest; it is nil only when nothing
// could be read. References to networks are checked by Resolve.
func LoadVMFile(file string, data []byte, opts VMFileOptions) (*VMFile, Diagnostics) {
	w := &walker{file: file}
	root := w.parse(data)
	if root == nil {
		if !w.diags.HasErrors() {
			w.errorf(nil, "", "is empty (expected `networks:` as in a lima instance file, or `vms:`)")
		}
		return nil, w.diags
	}
	if root.Kind != yaml.MappingNode {
		w.errorf(root, "", "must be a mapping with `networks:` or `vms:`, not %s", kindName(root))
		return nil, w.diags
	}
	top := map[string]*yaml.Node{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		top[deref(root.Content[i]).Value] = deref(root.Content[i+1])
	}
	vf := &VMFile{File: file}
	switch vms, nets := top["vms"], top["networks"]; {
	case vms != nil:
		vf.Shape = ShapeVMs
		w.mapping(root, "", map[string]fieldFunc{
			"vms": func(_, v *yaml.Node, path string) {
				if !w.mapping(v, path, nil, true) {
					return
				}
				for i := 0; i+1 < len(v.Content); i += 2 {
					k, vv := deref(v.Content[i]), deref(v.Content[i+1])
					if vm := w.vm(k, vv, joinPath(path, k.Value)); vm != nil {
						vf.VMs = append(vf.VMs, vm)
					}
				}
			},
		}, false)
	case nets != nil && nets.Kind == yaml.MappingNode:
		w.errorf(nets, "networks", "is a mapping, so this looks like networks.yaml; pass it with --networks (a VM file lists `networks:` entries like `- vmnet: shared`)")
	case nets != nil:
		vf.Shape = ShapeLima
		name, from := opts.Name, "--name"
		if name == "" {
			abs := opts.Abs
			if abs == "" {
				var err error
				if abs, err = filepath.Abs(file); err != nil {
					abs = file
				}
			}
			name, from = filepath.Base(filepath.Dir(abs)), "the file's directory"
		}
		if msg := checkVMName(name); msg != "" {
			w.errorf(nil, "", "VM name (from %s) %s; pass --name", from, msg)
			break
		}
		vm := &VM{Name: name, Source: Source{File: file, Line: 1}}
		for i := 0; i+1 < len(root.Content); i += 2 {
			if deref(root.Content[i]).Value == "networks" {
				vm.Source.Line = root.Content[i].Line
				w.entries(vm, deref(root.Content[i+1]), "networks")
			}
		}
		vf.VMs = append(vf.VMs, vm)
	default:
		w.errorf(root, "", "has neither `networks:` (a lima instance file) nor `vms:` (a multi-VM file)%s", suggest(firstKey(root), []string{"networks", "vms"}))
	}
	if vf.Shape == "" {
		return nil, w.diags
	}
	return vf, w.diags
}

func firstKey(n *yaml.Node) string {
	if len(n.Content) > 0 {
		return deref(n.Content[0]).Value
	}
	return ""
}

func (w *walker) vm(k, v *yaml.Node, path string) *VM {
	badName := checkVMName(k.Value)
	if badName != "" {
		w.errorf(k, path, "VM name %s", badName)
	}
	vm := &VM{Name: k.Value, Source: Source{File: w.file, Line: k.Line}, path: path}
	// Its entries are checked whatever its name: every problem at once.
	w.mapping(v, path, map[string]fieldFunc{
		"networks": func(_, v *yaml.Node, path string) { w.entries(vm, v, path) },
	}, false)
	if badName != "" {
		return nil
	}
	return vm
}

func (w *walker) entries(vm *VM, list *yaml.Node, path string) {
	if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return
	}
	if list.Kind != yaml.SequenceNode {
		w.errorf(list, path, "must be a list of entries like `- vmnet: shared`, not %s", kindName(list))
		return
	}
	for i, item := range list.Content {
		item = deref(item)
		p := fmt.Sprintf("%s[%d]", path, i)
		f, lines, ok := w.collect(item, p, entryKeys)
		if !ok {
			continue
		}
		at := func(k string) string { return joinPath(p, k) }
		var kinds []string
		for _, k := range []string{"lima", "vmnet", "socket", "vzNAT", "vnl"} {
			if _, ok := f[k]; ok {
				kinds = append(kinds, k)
			}
		}
		if len(kinds) != 1 {
			w.errorf(item, p, "needs exactly one of vmnet, lima, socket or vzNAT (has %d)", len(kinds))
			continue
		}
		src := Source{File: w.file, Line: item.Line}
		errsBefore := len(w.diags.Errors())
		switch kinds[0] {
		case "socket", "vzNAT", "vnl":
			reason := "not managed by vmnetctl"
			if kinds[0] == "vnl" {
				reason = "vnl was removed from lima; ignored"
				w.warnf(f["vnl"], at("vnl"), "%s", reason)
			}
			vm.Skipped = append(vm.Skipped, Skipped{Index: i, Entry: kinds[0], Reason: reason, Source: src})
			continue
		}
		if sp, ok := f["switchPort"]; ok {
			w.warnf(sp, at("switchPort"), "switchPort was removed from lima; ignored")
		}
		a := &Attachment{VM: vm.Name, Index: i, Ref: RefKind(kinds[0]), Metric: DefaultMetric,
			Interface: fmt.Sprintf("lima%d", i), Attach: AttachSocket, Source: src, lines: lines, path: p,
			key: vm.Name + "/" + strconv.Itoa(i)}
		if s, ok := w.str(f[kinds[0]], at(kinds[0])); ok {
			if msg := checkName(s); msg != "" {
				w.errorf(f[kinds[0]], at(kinds[0]), "network name %s", msg)
			}
			a.NetworkRef = s
		}
		if mv, ok := f["macAddress"]; ok {
			if s, ok := w.str(mv, at("macAddress")); ok {
				hw, msg := parseMAC(s)
				if msg != "" {
					w.errorf(mv, at("macAddress"), "%s", msg)
				} else {
					a.MAC = hw.String()
				}
			}
		} else {
			a.MAC, a.MACDerived = DeriveMAC(vm.Name, i).String(), true
			a.firstMAC, a.legacyMAC = a.MAC, LegacyMAC(vm.Name, i).String()
		}
		field(w, f, at, "interface", w.str, &a.Interface, func(s string, invalid func(string, ...any)) {
			if msg := checkIfName(s); msg != "" {
				invalid("%s", msg)
			}
		})
		field(w, f, at, "metric", w.integer, &a.Metric, func(m int, invalid func(string, ...any)) {
			if m < 0 {
				invalid("must not be negative")
			}
		})
		field(w, f, at, "ip", w.ipv4, &a.IP, nil)
		if av, ok := f["attach"]; ok {
			if s, ok := w.str(av, at("attach")); ok {
				switch AttachKind(s) {
				case AttachSocket, AttachTAP, AttachStream, AttachVhostUser:
					a.Attach = AttachKind(s)
				default:
					w.errorf(av, at("attach"), "must be socket, stream, tap or vhost-user, not %q%s", s, suggest(s, []string{"socket", "stream", "tap", "vhost-user"}))
				}
			}
		}
		check := true
		field(w, f, at, "spoofCheck", w.boolean, &check, nil)
		a.NoSpoofCheck = !check
		if pv, ok := f["portForwards"]; ok {
			a.PortForwards = w.forwards(pv, at("portForwards"))
		}
		if ev, ok := f["egress"]; ok {
			a.Egress = w.egressPolicy(ev, at("egress"), func(*yaml.Node, string, string) bool { return true })
		}
		if bv, ok := f["bandwidth"]; ok {
			a.Bandwidth = w.bandwidth(bv, at("bandwidth"))
		}
		if iv, ok := f["impair"]; ok {
			a.Impair = w.impair(iv, at("impair"))
			if a.Impair.Shaped() && a.Attach == AttachTAP {
				w.errorf(iv, at("impair"), "delay, jitter, duplicate and reorder are done by the helper, which attach: tap leaves out of the path (the VMM holds the TAP): give this entry a loss alone, or attach it by socket, stream or vhost-user")
			}
		}
		if len(w.diags.Errors()) == errsBefore {
			vm.Attachments = append(vm.Attachments, a)
		}
	}
}

// assignMACs gives every entry that names no MAC its own: the one it
// runs with (keep), if vmnetctl derives it for the entry and no entry
// names it, else the first of its derived MACs (deriveMAC) that no entry
// names or was given, entries taken by VM name and index. The result
// depends only on the files and what runs: a VM added later never takes
// a running VM's MAC. It returns an entry none was free for (16 tries
// taken), or nil.
func assignMACs(files []*VMFile, keep map[string]string) *Attachment {
	n := countAttachments(files)
	taken := make(map[string]bool, n)
	derived := make([]*Attachment, 0, n)
	for _, f := range files {
		for _, vm := range f.VMs {
			for _, a := range vm.Attachments {
				if a.MACDerived {
					derived = append(derived, a)
				} else {
					taken[a.MAC] = true
				}
			}
		}
	}
	slices.SortFunc(derived, func(a, b *Attachment) int {
		return cmp.Or(strings.Compare(a.VM, b.VM), cmp.Compare(a.Index, b.Index))
	})
	var rest []*Attachment
	for _, a := range derived {
		if mac, ok := keep[a.Key()]; ok && !taken[mac] && a.derivedFor(mac) {
			a.MAC, taken[mac] = mac, true
			continue
		}
		rest = append(rest, a)
	}
	var failed *Attachment
	for _, a := range rest {
		a.MAC = ""
		for try := range maxMACTries {
			mac, _ := a.derivedMACs()
			if try > 0 {
				mac = deriveMAC(a.VM, a.Index, try).String()
			}
			if !taken[mac] {
				a.MAC, taken[mac] = mac, true
				break
			}
		}
		if a.MAC == "" && failed == nil {
			failed = a
		}
	}
	return failed
}

// Resolve binds the VM files' network entries to the networks and checks
// what spans files: unknown networks, duplicate VM names, MACs and fixed IPs.
// It sets each Attachment's Network and moves entries that name a network
// vmnetctl does not manage to their VM's Skipped list.
func Resolve(nets *Networks, files []*VMFile) Diagnostics { return ResolveKeeping(nets, files, nil) }

// ResolveKeeping is Resolve, with the MACs of the attachments that run
// (keep: attachment key, VM/INDEX, to its MAC) kept where they are one
// vmnetctl derives for them and nobody set: an attachment that came up
// before a VM that now derives the same MAC, or before an upgrade changed
// the derivation (LegacyMAC), keeps its MAC while it runs.
func ResolveKeeping(nets *Networks, files []*VMFile, keep map[string]string) Diagnostics {
	return newResolver(nets, countAttachments(files)).resolve(files, keep)
}

// newResolver is a resolver of nets with room for n entries.
func newResolver(nets *Networks, n int) *resolver {
	r := &resolver{nets: nets, vms: make(map[string]*VM, n), macs: make(map[string]*Attachment, n), ips: map[netIP]*Attachment{}, ports: map[string]int{}}
	for _, n := range nets.Networks {
		r.names = append(r.names, n.Name)
	}
	return r
}

// resolve gives files' entries their MACs and resolves their VMs.
func (r *resolver) resolve(files []*VMFile, keep map[string]string) Diagnostics {
	if a := assignMACs(files, keep); a != nil {
		r.errAt(a.Source, a.lines[string(a.Ref)], a.path, "no MAC is free for this entry among the %d vmnetctl derives for it: give it a macAddress", maxMACTries)
	}
	for _, f := range files {
		for _, vm := range f.VMs {
			r.vm(vm)
		}
	}
	return r.ds
}

// countAttachments is how many entries files have (for the maps of
// Resolve, made at their size rather than grown).
func countAttachments(files []*VMFile) int {
	n := 0
	for _, f := range files {
		for _, vm := range f.VMs {
			n += len(vm.Attachments)
		}
	}
	return n
}

// resolver is Resolve's state: what the entries seen so far took.
type resolver struct {
	nets     *Networks
	ds       Diagnostics
	names    []string       // the networks', for suggestions
	vms      map[string]*VM // by lower-case name
	macs     map[string]*Attachment
	ips      map[netIP]*Attachment
	ports    map[string]int // VM ports by network
	total    int            // attachments in all
	forwards []ownedForward
}

// ownedForward is a forward the resolver saw, and the entry it is of.
type ownedForward struct {
	PortForward
	of *Attachment
}

// netIP is a fixed address on a network.
type netIP struct {
	net string
	ip  netip.Addr
}

func (r *resolver) errAt(src Source, line int, field, format string, args ...any) {
	if line == 0 {
		line = src.Line
	}
	r.ds = append(r.ds, Diagnostic{File: src.File, Line: line, Field: field, Message: fmt.Sprintf(format, args...)})
}

// vm resolves vm's entries, keeping those of networks vmnetctl manages.
func (r *resolver) vm(vm *VM) {
	// DNS names are case-insensitive: "db" and "DB" would be one name.
	if prev, dup := r.vms[strings.ToLower(vm.Name)]; dup {
		if prev.Name == vm.Name {
			r.errAt(vm.Source, 0, vm.path, "VM %q is also defined at %s", vm.Name, prev.Source)
		} else {
			r.errAt(vm.Source, 0, vm.path, "VM %q differs only in case from VM %q at %s: both would be one DNS name", vm.Name, prev.Name, prev.Source)
		}
	}
	r.vms[strings.ToLower(vm.Name)] = vm
	kept := vm.Attachments[:0]
	for _, a := range vm.Attachments {
		n := r.nets.Lookup(a.Ref, a.NetworkRef)
		if n == nil {
			r.errAt(a.Source, a.lines[string(a.Ref)], a.path+"."+string(a.Ref), "network %q is not defined in %s%s", a.NetworkRef, r.nets.Source, suggest(a.NetworkRef, r.names))
			continue
		}
		if !n.Managed() {
			vm.Skipped = append(vm.Skipped, Skipped{Index: a.Index, Entry: string(a.Ref) + ": " + a.NetworkRef, Reason: fmt.Sprintf("%s network, not managed by vmnetctl", n.Mode), Source: a.Source})
			continue
		}
		a.Network = n.ID
		kept = append(kept, a)
		r.limits(a, n)
		r.policies(a, n)
		r.mac(a, n)
		r.fixedIP(a, n)
	}
	vm.Attachments = kept
	slices.SortFunc(vm.Skipped, func(a, b Skipped) int { return cmp.Compare(a.Index, b.Index) })
}

// limits counts a on n against MaxAttachments and MaxPortsPerNetwork.
func (r *resolver) limits(a *Attachment, n *Network) {
	field := func() string { return a.path + "." + string(a.Ref) } // (only for an error: every entry, every pass)
	if r.total++; r.total == MaxAttachments+1 {
		r.errAt(a.Source, a.lines[string(a.Ref)], field(), "more than %d attachments in all: each is a helper process, and vmnetctl runs at most %d on a host; run the others under another state dir (--state-dir), or on another host", MaxAttachments, MaxAttachments)
	}
	if n.Routed() {
		if r.ports[n.ID]++; r.ports[n.ID] == MaxPortsPerNetwork+1 {
			r.errAt(a.Source, a.lines[string(a.Ref)], field(), "network %q has more than %d attachments: a network's bridge holds at most %d VM ports (the kernel's limit is 1023 ports a bridge); spread the VMs over more networks", n.ID, MaxPortsPerNetwork, MaxPortsPerNetwork)
		}
	}
}

// policies checks a's egress policy and port forwards against n and the
// forwards seen so far.
func (r *resolver) policies(a *Attachment, n *Network) {
	field := a.path
	if a.Egress != nil && !n.Routed() {
		r.errAt(a.Source, a.lines["egress"], field+".egress", "network %q is %s: egress policies are for shared and host networks", n.ID, n.Mode)
	}
	if a.Egress != nil && a.Egress.HasNames() && !n.DNSProxy {
		r.errAt(a.Source, a.lines["egress"], field+".egress", "lists names, which the DNS proxy of network %q learns, and it has none (dnsProxy: false)", n.ID)
	}
	if a.Impair != nil && !n.Routed() {
		r.errAt(a.Source, a.lines["impair"], field+".impair", "network %q is %s: impairment is for shared and host networks, whose ports vmnetctl's bridge table sees", n.ID, n.Mode)
	}
	if len(a.PortForwards) > 0 && !n.Routed() {
		r.errAt(a.Source, a.lines["portForwards"], field+".portForwards", "network %q is %s: its VMs are on the LAN already; forwards are for shared and host networks", n.ID, n.Mode)
	}
	for _, pf := range a.PortForwards {
		if msg := servicePortClash(r.nets, pf); msg != "" {
			r.errAt(pf.Source, pf.Source.Line, field+".portForwards", "%s", msg)
		}
		for _, prev := range r.forwards {
			if pf.conflicts(prev.PortForward) {
				r.errAt(pf.Source, pf.Source.Line, field+".portForwards", "host port %s/%s on %s is also forwarded at %s", pf.HostPort, pf.Proto, pf.HostIP, prev.Source)
			}
		}
		r.forwards = append(r.forwards, ownedForward{pf, a})
	}
}

// mac checks a's MAC: one a user wrote twice is an error (assignMACs gave
// the others free ones), and a reservation of n that names the MAC
// vmnetctl derived for a before it had 40 bits is warned of.
func (r *resolver) mac(a *Attachment, n *Network) {
	if prev, dup := r.macs[a.MAC]; dup && !a.MACDerived {
		at := prev.Source // its entry, or the line that gives it the MAC
		if l := prev.lines["macAddress"]; l > 0 {
			at.Line = l
		}
		r.errAt(a.Source, a.lines["macAddress"], a.path+".macAddress", "MAC %s is also used by VM %q at %s", a.MAC, prev.VM, at)
	}
	r.macs[a.MAC] = a
	if !a.MACDerived || len(n.Reservations) == 0 {
		return
	}
	if _, legacy := a.derivedMACs(); a.MAC != legacy {
		for _, res := range n.Reservations {
			if res.MAC == legacy {
				r.ds = append(r.ds, Diagnostic{Severity: SeverityWarning, File: n.Source.File, Line: res.Line, Field: "reservations",
					Message: fmt.Sprintf("%s was the MAC vmnetctl derived for VM %q (entry %d) before its MACs had 40 bits; it now derives %s, so this reservation no longer reaches the VM: write macAddress: %q in its entry to keep the old MAC, or reserve %s", legacy, a.VM, a.Index, a.MAC, legacy, a.MAC)})
			}
		}
	}
}

// fixedIP checks a's fixed address, if any, against n and the others.
func (r *resolver) fixedIP(a *Attachment, n *Network) {
	if !a.IP.IsValid() {
		return
	}
	ipField, ipLine := a.path+".ip", a.lines["ip"]
	switch {
	case !n.Routed():
		r.errAt(a.Source, ipLine, ipField, "network %q is %s: its LAN assigns addresses, not vmnetctl", n.ID, n.Mode)
		return
	case !n.Subnet.Contains(a.IP):
		r.errAt(a.Source, ipLine, ipField, "%s is outside the subnet %s of network %q", a.IP, n.Subnet, n.ID)
		return
	case a.IP == n.Gateway || a.IP == n.Subnet.Addr() || a.IP == broadcast(n.Subnet):
		r.errAt(a.Source, ipLine, ipField, "%s is the gateway, network or broadcast address of network %q", a.IP, n.ID)
		return
	case n.VXLAN != nil && n.DHCPStart.Compare(a.IP) <= 0 && a.IP.Compare(n.DHCPEnd) <= 0:
		// The other hosts do not read this VM file: one of them could
		// lease the address.
		r.errAt(a.Source, ipLine, ipField, "%s is in the DHCP range %s-%s of network %q, which spans hosts that do not read this file: give an address outside the range, or a reservation in networks.yaml",
			a.IP, n.DHCPStart, n.DHCPEnd, n.ID)
		return
	}
	for _, res := range n.Reservations {
		if res.IP == a.IP && res.MAC != a.MAC {
			r.errAt(a.Source, ipLine, ipField, "%s is reserved for %s in %s:%d", a.IP, res.MAC, n.Source.File, res.Line)
		}
	}
	k := netIP{n.ID, a.IP}
	if prev, dup := r.ips[k]; dup {
		r.errAt(a.Source, ipLine, ipField, "%s is also the fixed address of VM %q at %s", a.IP, prev.VM, prev.Source)
	}
	r.ips[k] = a
}
