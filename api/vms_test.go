package api

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"strings"
	"testing"
)

const testNetworks = `
networks:
  user-v2: {mode: user-v2, gateway: 192.168.104.1}
  shared: {mode: shared, gateway: 192.168.105.1}
  host: {mode: host, gateway: 192.168.106.1}
  br: {mode: bridged, interface: eth0}
vmnet:
  lab:
    subnet: 10.10.0.0/24
    reservations:
      "52:55:55:00:00:99": 10.10.0.50
`

// loadAll loads each file (name → content) and resolves them; files are
// loaded in the order given.
func loadAll(t *testing.T, opts VMFileOptions, files ...[2]string) ([]*VMFile, Diagnostics) {
	t.Helper()
	nets := mustNetworks(t, testNetworks)
	var all Diagnostics
	var vfs []*VMFile
	for _, f := range files {
		vf, diags := LoadVMFile(f[0], []byte(f[1]), opts)
		all = append(all, diags...)
		if vf != nil {
			vfs = append(vfs, vf)
		}
	}
	return vfs, append(all, Resolve(nets, vfs)...)
}

func TestLimaInstanceFile(t *testing.T) {
	src := `
vmType: vz
images: [{location: x}]
networks:
  - vmnet: shared
  - lima: host
    macAddress: "52:55:55:12:34:56"
    interface: eth5
    metric: 50
  - lima: user-v2
  - socket: /var/run/socket_vmnet
  - vzNAT: true
`
	vfs, diags := loadAll(t, VMFileOptions{}, [2]string{"/home/u/.lima/dev/lima.yaml", src})
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", diagText(diags))
	}
	vm := vfs[0].VMs[0]
	if vfs[0].Shape != ShapeLima || vm.Name != "dev" {
		t.Fatalf("shape %q, VM %q; want lima, dev", vfs[0].Shape, vm.Name)
	}
	if len(vm.Attachments) != 2 {
		t.Fatalf("got %d attachments, want 2", len(vm.Attachments))
	}
	a0, a1 := vm.Attachments[0], vm.Attachments[1]
	if a0.Network != "shared" || a0.MAC != DeriveMAC("dev", 0).String() || !a0.MACDerived || a0.Interface != "lima0" || a0.Metric != 100 || a0.Attach != AttachSocket {
		t.Errorf("first attachment = %+v", a0)
	}
	if a1.Network != "host" || a1.MAC != "52:55:55:12:34:56" || a1.MACDerived || a1.Interface != "eth5" || a1.Metric != 50 {
		t.Errorf("second attachment = %+v", a1)
	}
	var entries []string
	for _, s := range vm.Skipped {
		entries = append(entries, s.Entry)
	}
	if want := []string{"lima: user-v2", "socket", "vzNAT"}; len(entries) != 3 || entries[0] != want[0] || entries[1] != want[1] || entries[2] != want[2] {
		t.Errorf("skipped = %v, want %v", entries, want)
	}
}

func TestLimaInstanceFileName(t *testing.T) {
	src := "networks:\n  - vmnet: shared\n"
	vfs, diags := loadAll(t, VMFileOptions{Name: "given"}, [2]string{"x/lima.yaml", src})
	if diags.HasErrors() || vfs[0].VMs[0].Name != "given" {
		t.Fatalf("--name not used: %v %s", vfs, diagText(diags))
	}
	_, diags = loadAll(t, VMFileOptions{}, [2]string{"/tmp/bad dir/lima.yaml", src})
	checkDiags(t, diags, SeverityError, []want{{0, "", "from the file's directory"}})
	// A path relative to another process's directory (a project the
	// controller parses again): the name comes from the absolute path the
	// command recorded, wherever this process runs.
	vfs, diags = loadAll(t, VMFileOptions{Abs: "/home/u/.lima/web/lima.yaml"}, [2]string{"lima.yaml", src})
	if diags.HasErrors() || vfs[0].VMs[0].Name != "web" {
		t.Fatalf("the recorded absolute path not used: %v %s", vfs, diagText(diags))
	}
}

func TestMultiVMFile(t *testing.T) {
	src := `
vms:
  a:
    networks:
      - vmnet: lab
        ip: 10.10.0.7
        attach: tap
        spoofCheck: false
  b:
    networks:
      - vmnet: shared
      - vmnet: lab
`
	vfs, diags := loadAll(t, VMFileOptions{}, [2]string{"vms.yaml", src})
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", diagText(diags))
	}
	vms := vfs[0].VMs
	if len(vms) != 2 || vms[0].Name != "a" || vms[1].Name != "b" {
		t.Fatalf("VMs = %+v", vms)
	}
	a := vms[0].Attachments[0]
	if a.IP != netip.MustParseAddr("10.10.0.7") || a.Attach != AttachTAP || a.Network != "lab" {
		t.Errorf("a's attachment = %+v", a)
	}
	if a.SpoofCheck() || !vms[1].Attachments[0].SpoofCheck() {
		t.Errorf("spoofCheck: a's is %v (set false), b's %v (default true)", a.SpoofCheck(), vms[1].Attachments[0].SpoofCheck())
	}
	if vms[1].Attachments[1].MAC != DeriveMAC("b", 1).String() {
		t.Errorf("b's second MAC is not derived from (b, 1)")
	}
}

func TestDeriveMACIsStable(t *testing.T) {
	// Pinned: the same file must give the same MACs on every machine and run.
	if got := DeriveMAC("default", 0).String(); got != "52:09:05:a7:d7:99" {
		t.Errorf("DeriveMAC(default, 0) = %s; changing it changes every user's MACs", got)
	}
	// The MAC of before (LegacyMAC), which running attachments keep.
	if got := LegacyMAC("default", 0).String(); got != "52:55:55:09:05:a7" {
		t.Errorf("LegacyMAC(default, 0) = %s; running VMs would lose their MACs", got)
	}
	if DeriveMAC("a", 0).String() == DeriveMAC("a", 1).String() {
		t.Errorf("two entries of one VM got the same MAC")
	}
}

func TestVMFileErrors(t *testing.T) {
	tests := []struct {
		name  string
		files [][2]string
		wants []want
	}{
		{"undefined network with a suggestion", [][2]string{{"v.yaml", "networks:\n  - vmnet: shraed\n"}},
			[]want{{2, "networks[0].vmnet", `did you mean "shared"?`}}},
		{"two kinds in one entry", [][2]string{{"v.yaml", "networks:\n  - vmnet: shared\n    lima: host\n"}},
			[]want{{2, "networks[0]", "exactly one of"}}},
		{"unknown entry key", [][2]string{{"v.yaml", "networks:\n  - vmnet: shared\n    macadress: x\n"}},
			[]want{{3, "networks[0].macadress", `did you mean "macAddress"?`}}},
		{"bad MAC", [][2]string{{"v.yaml", "networks:\n  - vmnet: shared\n    macAddress: 52:55:55:zz:00:01\n"}},
			[]want{{3, "networks[0].macAddress", "not a MAC address"}}},
		{"duplicate MACs across files", [][2]string{
			{"a/lima.yaml", "networks:\n  - vmnet: shared\n    macAddress: \"52:55:55:00:00:01\"\n"},
			{"b/lima.yaml", "networks:\n  - vmnet: host\n    macAddress: \"52:55:55:00:00:01\"\n"}},
			[]want{{3, "networks[0].macAddress", `also used by VM "a"`}}},
		{"duplicate fixed IPs", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lab\n        ip: 10.10.0.9\n  b:\n    networks:\n      - vmnet: lab\n        ip: 10.10.0.9\n"}},
			[]want{{9, "vms.b.networks[0].ip", `also the fixed address of VM "a"`}}},
		{"fixed IP outside the subnet", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lab\n        ip: 10.11.0.9\n"}},
			[]want{{5, "vms.a.networks[0].ip", "outside the subnet"}}},
		{"fixed IP on a bridged network", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - lima: br\n        ip: 10.11.0.9\n"}},
			[]want{{5, "vms.a.networks[0].ip", "its LAN assigns addresses"}}},
		{"fixed IP reserved for another MAC", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lab\n        ip: 10.10.0.50\n"}},
			[]want{{5, "vms.a.networks[0].ip", "reserved for 52:55:55:00:00:99"}}},
		{"bad attach", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lab\n        attach: tapp\n"}},
			[]want{{5, "vms.a.networks[0].attach", `did you mean "tap"?`}}},
		{"spoofCheck not a boolean", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: lab\n        spoofCheck: sometimes\n"}},
			[]want{{5, "vms.a.networks[0].spoofCheck", "true or false"}}},
		{"VM name not a DNS label", [][2]string{{"v.yaml", "vms:\n  ubuntu-24.04:\n    networks: []\n"}},
			[]want{{2, "vms.ubuntu-24.04", "not a DNS label"}}},
		{"VM names equal but for case", [][2]string{{"v.yaml", "vms:\n  db:\n    networks: []\n  DB:\n    networks: []\n"}},
			[]want{{4, "vms.DB", "differs only in case"}}},
		{"duplicate VM names", [][2]string{{"v.yaml", "vms:\n  a:\n    networks: []\n"}, {"w.yaml", "vms:\n  a:\n    networks: []\n"}},
			[]want{{2, "vms.a", "also defined at v.yaml:2"}}},
		{"VM name injection", [][2]string{{"v.yaml", "vms:\n  \"a b\":\n    networks: []\n"}},
			[]want{{2, "vms.a b", "not a DNS label"}}},
		{"guest interface too long", [][2]string{{"v.yaml", "networks:\n  - vmnet: shared\n    interface: abcdefghijklmnopq\n"}},
			[]want{{3, "networks[0].interface", "longer than 15"}}},
		{"a networks.yaml passed as a VM file", [][2]string{{"v.yaml", "networks:\n  shared:\n    mode: shared\n"}},
			[]want{{2, "networks", "pass it with --networks"}}},
		{"neither shape", [][2]string{{"v.yaml", "vm:\n  a: {}\n"}},
			[]want{{1, "", `did you mean "vms"?`}}},
		{"unknown key in a multi-VM file", [][2]string{{"v.yaml", "vms:\n  a:\n    network: []\n"}},
			[]want{{3, "vms.a.network", `did you mean "networks"?`}}},
		{"every problem at once", [][2]string{{"v.yaml", "vms:\n  a:\n    networks:\n      - vmnet: nope\n      - vmnet: shared\n        metric: -1\n  b:\n    networks:\n      - vmnet: lab\n        ip: 10.10.0.1\n"}},
			[]want{{4, "vms.a.networks[0].vmnet", "not defined"}, {6, "vms.a.networks[1].metric", "negative"}, {10, "vms.b.networks[0].ip", "gateway"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, diags := loadAll(t, VMFileOptions{}, tt.files...)
			checkDiags(t, diags, SeverityError, tt.wants)
		})
	}
}

func TestVMFileWarnings(t *testing.T) {
	_, diags := loadAll(t, VMFileOptions{Name: "v"}, [2]string{"v.yaml", "networks:\n  - vnl: /tmp/vde.ctl\n    switchPort: 65535\n  - vmnet: shared\n    switchPort: 1\n"})
	if diags.HasErrors() {
		t.Fatalf("errors:\n%s", diagText(diags))
	}
	checkDiags(t, diags, SeverityWarning, []want{{2, "networks[0].vnl", "removed from lima"}, {5, "networks[1].switchPort", "removed from lima"}})
}

func TestBridgeName(t *testing.T) {
	tests := map[string]string{
		"shared":               "vmn-shared",
		"abcdefghijk":          "vmn-abcdefghijk",
		"abcdefghijkl":         "vmn-abcd-",
		"a-very-long-name-too": "vmn-a-ve-",
	}
	for id, prefix := range tests {
		got := BridgeName(id)
		if len(got) > MaxIfNameLen || got[:len(prefix)] != prefix {
			t.Errorf("BridgeName(%q) = %q, want a name of at most 15 bytes starting with %q", id, got, prefix)
		}
	}
	if BridgeName("abcdefghijkl") == BridgeName("abcdefghijkm") {
		t.Errorf("long names that differ got the same bridge")
	}
}

// TestFleetLimits: a network takes at most MaxPortsPerNetwork attachments
// and the files MaxAttachments in all, each refused at the first one past
// it, by its line; a file of 100,000 VMs is refused for its size, in
// bounded memory; a MAC a user wrote twice gets an error naming the
// macAddress field.
func TestFleetLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString("vms:\n")
	for i := range MaxPortsPerNetwork + 1 {
		fmt.Fprintf(&b, "  vm%05d:\n    networks: [{vmnet: shared}]\n", i)
	}
	_, diags := loadAll(t, VMFileOptions{}, [2]string{"fleet.yaml", b.String()})
	want := fmt.Sprintf("fleet.yaml:%d", 2+2*MaxPortsPerNetwork+1)
	if text := diagText(diags); !strings.Contains(text, want) || !strings.Contains(text, "at most 1000 VM ports") {
		t.Errorf("%d VMs on one network: %s; want an error at %s", MaxPortsPerNetwork+1, text, want)
	}

	// A state dir's VM files take at most MaxAttachments in all (eleven
	// networks of 910 VMs: none is full), refused at the first one
	// past it, by its line.
	var nb, vb strings.Builder
	nb.WriteString("vmnet:\n")
	vb.WriteString("vms:\n")
	for i := range 11 {
		fmt.Fprintf(&nb, "  n%d:\n    subnet: 10.%d.0.0/20\n", i, 100+i)
	}
	for i := range MaxAttachments + 1 {
		fmt.Fprintf(&vb, "  v%05d:\n    networks: [{vmnet: n%d}]\n", i, i%11)
	}
	nets, ndiags := LoadNetworks("networks.yaml", []byte(nb.String()))
	if err := ndiags.Err(); err != nil {
		t.Fatal(err)
	}
	vf, diags := LoadVMFile("fleet.yaml", []byte(vb.String()), VMFileOptions{})
	if vf != nil {
		diags = append(diags, Resolve(nets, []*VMFile{vf})...)
	}
	want = fmt.Sprintf("fleet.yaml:%d", 2+2*MaxAttachments+1)
	if text := diagText(diags); !strings.Contains(text, want) || !strings.Contains(text, "more than 10000 attachments in all") {
		t.Errorf("%d VMs in all: %.300s; want an error at %s", MaxAttachments+1, text, want)
	}

	// A file of 100,000 VMs is refused for its size, in bounded time and
	// memory, before any VM is looked at.
	vb.Reset()
	vb.WriteString("vms:\n")
	for i := range 100000 {
		fmt.Fprintf(&vb, "  v%06d:\n    networks: [{vmnet: shared}]\n", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, diags = LoadVMFile("huge.yaml", []byte(vb.String()), VMFileOptions{})
	runtime.ReadMemStats(&after)
	if text := diagText(diags); !strings.Contains(text, "vmnetctl reads files of at most") {
		t.Errorf("a file of 100,000 VMs: %.300s", text)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("refusing a file of 100,000 VMs allocated %d bytes", alloc)
	}

	// A user's MAC twice is an error that names the field.
	_, diags = loadAll(t, VMFileOptions{}, [2]string{"vms.yaml", "vms:\n  a:\n    networks: [{vmnet: shared, macAddress: \"52:55:55:00:00:01\"}]\n  b:\n    networks: [{vmnet: shared, macAddress: \"52:55:55:00:00:01\"}]\n"})
	if text := diagText(diags); !strings.Contains(text, "macAddress: MAC 52:55:55:00:00:01 is also used by VM \"a\"") {
		t.Errorf("one macAddress for two VMs: %s", text)
	}
	// ... and points at the line that gave the other VM the MAC.
	_, diags = loadAll(t, VMFileOptions{}, [2]string{"vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n        macAddress: \"52:55:55:00:00:01\"\n  b:\n    networks:\n      - vmnet: shared\n        macAddress: \"52:55:55:00:00:01\"\n"})
	if text := diagText(diags); !strings.Contains(text, "vms.yaml:9: vms.b.networks[0].macAddress: MAC 52:55:55:00:00:01 is also used by VM \"a\" at vms.yaml:5") {
		t.Errorf("one macAddress for two VMs, on lines of their own: %s", text)
	}
}

// TestDerivedMACsNeverClash: derived MACs that are one (two names whose
// 40 bits agree, found by search; or a MAC a user wrote for another VM)
// are no error: the entry that comes later by VM name moves to its next
// derived MAC, the same on every run; an attachment that runs keeps its
// MAC while it is one vmnetctl derives for it (also the legacy 24-bit
// one), so that neither a VM added later nor an upgrade changes it.
func TestDerivedMACsNeverClash(t *testing.T) {
	x, y := "n1041117", "n1570643"
	if DeriveMAC(x, 0).String() != DeriveMAC(y, 0).String() {
		t.Fatalf("%s and %s no longer derive one MAC", x, y)
	}
	nets := mustNetworks(t, testNetworks)
	resolve := func(src string, keep map[string]string) map[string]string {
		t.Helper()
		vf, diags := LoadVMFile("vms.yaml", []byte(src), VMFileOptions{})
		if vf != nil {
			diags = append(diags, ResolveKeeping(nets, []*VMFile{vf}, keep)...)
		}
		if diags.HasErrors() || len(diags) > 0 {
			t.Fatalf("%s", diagText(diags))
		}
		macs := map[string]string{}
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				macs[a.VM] = a.MAC
			}
		}
		return macs
	}
	vms := fmt.Sprintf("vms:\n  %s:\n    networks: [{vmnet: shared}]\n  %s:\n    networks: [{vmnet: shared}]\n", y, x)
	base := DeriveMAC(x, 0).String()
	for _, c := range []struct {
		name string
		keep map[string]string
		want map[string]string
	}{
		{"by name", nil, map[string]string{x: base, y: deriveMAC(y, 0, 1).String()}},
		{"the running one keeps it", map[string]string{y + "/0": base}, map[string]string{x: deriveMAC(x, 0, 1).String(), y: base}},
		{"a legacy MAC kept", map[string]string{x + "/0": LegacyMAC(x, 0).String()}, map[string]string{x: LegacyMAC(x, 0).String(), y: base}},
		{"a MAC not derived for it is not kept", map[string]string{x + "/0": "52:55:55:00:00:01"}, map[string]string{x: base, y: deriveMAC(y, 0, 1).String()}},
	} {
		if got := resolve(vms, c.keep); !maps.Equal(got, c.want) {
			t.Errorf("%s: MACs %v, want %v", c.name, got, c.want)
		}
	}
	// A MAC written for another VM: the derived one moves, no error (the
	// user never wrote the field an error would name).
	got := resolve(fmt.Sprintf("vms:\n  p:\n    networks: [{vmnet: shared, macAddress: %q}]\n  %s:\n    networks: [{vmnet: shared}]\n", base, x), nil)
	if got["p"] != base || got[x] != deriveMAC(x, 0, 1).String() {
		t.Errorf("a derived MAC that a user wrote for another VM: %v", got)
	}
	// Kept, even when a user now writes it for another VM: the user's
	// wins.
	got = resolve(fmt.Sprintf("vms:\n  p:\n    networks: [{vmnet: shared, macAddress: %q}]\n  %s:\n    networks: [{vmnet: shared}]\n", base, x), map[string]string{x + "/0": base})
	if got["p"] != base || got[x] != deriveMAC(x, 0, 1).String() {
		t.Errorf("a running VM's MAC written for another VM: %v", got)
	}
}

// TestLegacyReservationWarned: a reservation of networks.yaml that names
// the MAC vmnetctl derived for a VM before its MACs had 40 bits is
// warned of, with both MACs, since it no longer reaches the VM.
func TestLegacyReservationWarned(t *testing.T) {
	legacy := LegacyMAC("db", 0).String()
	nets := mustNetworks(t, "networks:\n  shared:\n    mode: shared\n    gateway: 192.168.105.1\n    dhcpEnd: 192.168.105.254\n    netmask: 255.255.255.0\n    reservations:\n      \""+legacy+"\": 192.168.105.40\n")
	vf, diags := LoadVMFile("vms.yaml", []byte("vms:\n  db:\n    networks: [{vmnet: shared}]\n"), VMFileOptions{})
	diags = append(diags, Resolve(nets, []*VMFile{vf})...)
	text := diagText(diags)
	if diags.HasErrors() || !strings.Contains(text, legacy) || !strings.Contains(text, DeriveMAC("db", 0).String()) || !strings.Contains(text, "macAddress") {
		t.Errorf("a reservation of db's legacy MAC: %s", text)
	}
	// Kept (it runs with it): nothing to say.
	diags = ResolveKeeping(nets, []*VMFile{mustLoad(t, "vms:\n  db:\n    networks: [{vmnet: shared}]\n")}, map[string]string{"db/0": legacy})
	if len(diags) > 0 {
		t.Errorf("db runs with its legacy MAC, reserved: %s", diagText(diags))
	}
}

func mustLoad(t *testing.T, src string) *VMFile {
	t.Helper()
	vf, diags := LoadVMFile("vms.yaml", []byte(src), VMFileOptions{})
	if diags.HasErrors() {
		t.Fatal(diagText(diags))
	}
	return vf
}

// TestAttachmentKey: an attachment's key is its VM and its index, as
// "%s/%d" writes them, at one allocation.
func TestAttachmentKey(t *testing.T) {
	for _, a := range []Attachment{{VM: "a"}, {VM: "vm-1", Index: 9}, {VM: "x.y", Index: 10}, {VM: "z", Index: 12345}} {
		if got, want := a.Key(), fmt.Sprintf("%s/%d", a.VM, a.Index); got != want {
			t.Errorf("Key() = %q, want %q", got, want)
		}
	}
	a := &Attachment{VM: "c00001", Index: 3}
	if n := testing.AllocsPerRun(100, func() { _ = a.Key() }); n > 1 {
		t.Errorf("Key() allocates %v times, want at most once", n)
	}
	// An entry read from a file, and its clone, have it made already.
	f := mustLoad(t, "vms:\n  web:\n    networks:\n      - vmnet: shared\n      - vmnet: host\n")
	for _, a := range append(f.VMs[0].Attachments, f.Clone().VMs[0].Attachments...) {
		if got, want := a.Key(), fmt.Sprintf("web/%d", a.Index); got != want {
			t.Errorf("Key() of an entry read = %q, want %q", got, want)
		}
		if n := testing.AllocsPerRun(100, func() { _ = a.Key() }); n != 0 {
			t.Errorf("Key() of an entry read allocates %v times, want none", n)
		}
	}
}

// TestDerivedMACsKept: the MACs an entry derives, taken once when its
// file is read, are those DeriveMAC and LegacyMAC give, and an attachment
// made otherwise (not read from a file) takes them the same; its own
// tries are recognised, another entry's not.
func TestDerivedMACsKept(t *testing.T) {
	vf, diags := LoadVMFile("vms.yaml", []byte("vms:\n  web:\n    networks:\n      - vmnet: shared\n      - vmnet: host\n"), VMFileOptions{})
	if err := diags.Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range append(vf.VMs[0].Attachments, &Attachment{VM: "web", Index: 1}) {
		first, legacy := a.derivedMACs()
		if first != DeriveMAC("web", a.Index).String() || legacy != LegacyMAC("web", a.Index).String() {
			t.Errorf("entry %d: derived %s and %s, want %s and %s", a.Index, first, legacy, DeriveMAC("web", a.Index), LegacyMAC("web", a.Index))
		}
		if !a.derivedFor(first) || !a.derivedFor(legacy) || !a.derivedFor(deriveMAC("web", a.Index, 3).String()) {
			t.Errorf("entry %d: its own MACs are not taken for its own", a.Index)
		}
		if a.derivedFor(DeriveMAC("web", 1-a.Index).String()) || a.derivedFor(DeriveMAC("db", a.Index).String()) {
			t.Errorf("entry %d: another entry's MAC is taken for its own", a.Index)
		}
	}
}

// TestClone: a clone of a VM file, of one VM of one entry (one
// allocation) or of more, is equal to it, and what Resolve writes into
// the clone (MACs, networks, the entries kept, skipped ones) leaves the
// file as it was.
func TestClone(t *testing.T) {
	for _, src := range []string{
		"vms:\n  solo:\n    networks: [{vmnet: shared}]\n",
		"vms:\n  a:\n    networks: [{vmnet: shared}, {vmnet: host}]\n  b:\n    networks: [{vmnet: shared}]\n",
	} {
		f, diags := LoadVMFile("vms.yaml", []byte(src), VMFileOptions{})
		if err := diags.Err(); err != nil {
			t.Fatal(err)
		}
		before := fmt.Sprintf("%#v", fileValues(f))
		c := f.Clone()
		if got := fmt.Sprintf("%#v", fileValues(c)); got != before {
			t.Errorf("%q: clone\n%s\nwant\n%s", src, got, before)
		}
		for _, vm := range c.VMs {
			for _, a := range vm.Attachments {
				a.MAC, a.Network = "52:55:55:ff:ff:ff", "changed"
			}
			vm.Attachments = append(vm.Attachments[:0], vm.Attachments[len(vm.Attachments)-1])
			vm.Attachments = append(vm.Attachments, &Attachment{VM: "x"})
			vm.Skipped = append(vm.Skipped, Skipped{Reason: "changed"})
		}
		c.VMs = append(c.VMs[:0], c.VMs[len(c.VMs)-1])
		if after := fmt.Sprintf("%#v", fileValues(f)); after != before {
			t.Errorf("%q: the file after its clone changed:\n%s\nwant\n%s", src, after, before)
		}
	}
}

// fileValues is f with its VMs and entries as values, for %#v.
func fileValues(f *VMFile) any {
	type vmv struct {
		VM          VM
		Attachments []Attachment
	}
	file := *f
	file.VMs = nil
	out := []any{file}
	for _, vm := range f.VMs {
		v := vmv{VM: *vm}
		v.VM.Attachments = nil
		for _, a := range vm.Attachments {
			v.Attachments = append(v.Attachments, *a)
		}
		out = append(out, v)
	}
	return out
}
