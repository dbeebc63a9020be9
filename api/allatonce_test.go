// An external test package: the golden files go through testutil, which
// imports api.
package api_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// lines is every diagnostic of ds, sorted, one per line, as validate
// prints them.
func lines(ds api.Diagnostics) string {
	var b strings.Builder
	for _, d := range ds.Sorted() {
		fmt.Fprintln(&b, d)
	}
	return b.String()
}

// TestEveryMistakeAtOnce: independent mistakes of one file are all
// reported in one pass (issue 36): an unknown mode, a gateway that is no
// address, a netmask that is no netmask, and the values every mode takes
// (an MTU out of range, a switch that is no boolean); a VM whose name is invalid
// has its entries checked all the same. The whole of each message is in
// testdata/every-mistake-at-once.txt.
func TestEveryMistakeAtOnce(t *testing.T) {
	_, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  lab:\n    mode: hostt\n    gateway: 192.168.121.300\n    netmask: 255.0.255.0\n    mtu: 10\n    dhcp: maybe\n"))
	errs := diags.Errors()
	for _, want := range []string{"n.yaml:3", "n.yaml:4", "n.yaml:5", "n.yaml:6", "n.yaml:7"} {
		found := false
		for _, d := range errs {
			found = found || strings.HasPrefix(d.String(), want+":")
		}
		if !found {
			t.Errorf("no error at %s; got %d: %v", want, len(errs), errs)
		}
	}
	if len(errs) != 5 {
		t.Errorf("%d errors for 5 mistakes: %v", len(errs), errs)
	}

	_, vdiags := api.LoadVMFile("v.yaml", []byte("vms:\n  \"bad name\":\n    networks:\n      - vmnet: shared\n        macAddress: nope\n"), api.VMFileOptions{})
	verrs := vdiags.Errors()
	if len(verrs) != 2 || !strings.Contains(verrs[0].String()+verrs[1].String(), "macAddress") {
		t.Errorf("a VM with a bad name and a bad MAC: %d errors: %v", len(verrs), verrs)
	}
	testutil.Golden(t, filepath.Join("testdata", "every-mistake-at-once.txt"), lines(diags)+lines(vdiags))
}

// TestNetworkSocketKey: `socket: true` is a routed network's; a bridged
// one has no ports of vmnetctl's to give, and says so at the line.
func TestNetworkSocketKey(t *testing.T) {
	nets, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  s:\n    mode: shared\n    subnet: 10.71.0.0/24\n    socket: true\n"))
	if err := diags.Err(); err != nil || !nets.Get("s").Socket {
		t.Fatalf("socket: true on a shared network: %v %+v", err, nets)
	}
	_, diags = api.LoadNetworks("n.yaml", []byte("vmnet:\n  b:\n    mode: bridged\n    interface: eth0\n    socket: true\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:5") {
		t.Errorf("socket: true on a bridged network: %v", err)
	}
}

// TestYAMLErrorsSayWhat: a tab says it is a tab and what to do, at its
// line; bytes that are not UTF-8 are found at their line; a VM name with
// a dot is told no dots, not that dots are allowed; nesting too deep is
// told at the line where it starts, in either file. Each message whole is
// in testdata/yaml-errors.txt.
func TestYAMLErrorsSayWhat(t *testing.T) {
	var all strings.Builder
	// record adds a case's error to the golden text.
	record := func(name string, err error) {
		fmt.Fprintf(&all, "# %s\n%v\n", name, err)
	}
	_, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  a:\n\tmode: host\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:3") || !strings.Contains(err.Error(), "tab") || !strings.Contains(err.Error(), "spaces") {
		t.Errorf("a tab: %v", err)
	}
	record("a tab in networks.yaml", diags.Err())
	_, vdiags := api.LoadVMFile("v.yaml", []byte("vms:\n  a:\n\tnetworks: [{vmnet: shared}]\n"), api.VMFileOptions{})
	record("a tab in a VM file", vdiags.Err())
	_, diags = api.LoadNetworks("n.yaml", []byte("vmnet:\n  a:\n    mode: h\xffst\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:3") || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("not UTF-8: %v", err)
	}
	record("not UTF-8 in networks.yaml", diags.Err())
	_, vdiags = api.LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: sh\xc3\x28ared\n"), api.VMFileOptions{})
	record("not UTF-8 in a VM file", vdiags.Err())
	_, vdiags = api.LoadVMFile("v.yaml", []byte("vms:\n  a.b:\n    networks: [{vmnet: shared}]\n"), api.VMFileOptions{})
	if err := vdiags.Err(); err == nil || !strings.Contains(err.Error(), "no dots") {
		t.Errorf("a VM name with a dot: %v", err)
	}
	record("a VM name with a dot", vdiags.Err())
	// Nesting too deep for the parser: the line where it starts.
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	_, vdiags = api.LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: "+deep+"\n"), api.VMFileOptions{})
	if err := vdiags.Err(); err == nil || !strings.Contains(err.Error(), "v.yaml:4") || !strings.Contains(err.Error(), "depth") {
		t.Errorf("nesting too deep in a VM file: %v", err)
	}
	record("nesting too deep in a VM file", vdiags.Err())
	_, diags = api.LoadNetworks("n.yaml", []byte("vmnet:\n  a: "+deep+"\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:2") || !strings.Contains(err.Error(), "depth") {
		t.Errorf("nesting too deep in networks.yaml: %v", err)
	}
	record("nesting too deep in networks.yaml", diags.Err())
	testutil.Golden(t, filepath.Join("testdata", "yaml-errors.txt"), all.String())
}

// TestVMNameHintAgrees: the VM-name error says what a VM name may be
// (letters, digits, '-' and '_', no dots, starting and ending with a
// letter or digit, at most 63 characters), and what it says is what is
// accepted: every name the hint allows loads, every name it rules out is
// refused with it. A network's name may have dots (its own rule, its own
// words). The refusals whole are in testdata/vm-names.txt.
func TestVMNameHintAgrees(t *testing.T) {
	vmFile := func(name string) string {
		return fmt.Sprintf("vms:\n  %q:\n    networks: [{vmnet: shared}]\n", name)
	}
	for _, name := range []string{"a", "A9", "web-1", "db_2", "a-b_c", "0", strings.Repeat("x", 63)} {
		if _, diags := api.LoadVMFile("v.yaml", []byte(vmFile(name)), api.VMFileOptions{}); diags.HasErrors() {
			t.Errorf("VM name %q, which the hint allows: %v", name, diags.Err())
		}
	}
	var refused strings.Builder
	for _, name := range []string{"a.b", "-a", "a-", "_a", "a_", "a b", "é", strings.Repeat("x", 64)} {
		_, diags := api.LoadVMFile("v.yaml", []byte(vmFile(name)), api.VMFileOptions{})
		errs := diags.Errors()
		if len(errs) != 1 || errs[0].Line != 2 {
			t.Errorf("VM name %q, which the hint rules out: %v, want one error at line 2", name, errs)
		}
		refused.WriteString(lines(diags))
	}
	if _, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  a.b:\n    subnet: 10.1.2.0/24\n")); diags.HasErrors() {
		t.Errorf("network name a.b, which a network's hint allows: %v", diags.Err())
	}
	_, diags := api.LoadNetworks("n.yaml", []byte("vmnet:\n  -a:\n    subnet: 10.1.2.0/24\n"))
	refused.WriteString(lines(diags))
	testutil.Golden(t, filepath.Join("testdata", "vm-names.txt"), refused.String())
}
