package api

import (
	"strings"
	"testing"
)

// TestEveryMistakeAtOnce: independent mistakes of one file are all
// reported in one pass (issue 36): an unknown mode, a gateway that is no
// address and a netmask that is no netmask; a VM whose name is invalid
// has its entries checked all the same.
func TestEveryMistakeAtOnce(t *testing.T) {
	_, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  lab:\n    mode: hostt\n    gateway: 192.168.121.300\n    netmask: 255.0.255.0\n"))
	errs := diags.Errors()
	for _, want := range []string{"n.yaml:3", "n.yaml:4", "n.yaml:5"} {
		found := false
		for _, d := range errs {
			found = found || strings.HasPrefix(d.String(), want+":")
		}
		if !found {
			t.Errorf("no error at %s; got %d: %v", want, len(errs), errs)
		}
	}
	if len(errs) != 3 {
		t.Errorf("%d errors for 3 mistakes: %v", len(errs), errs)
	}

	_, vdiags := LoadVMFile("v.yaml", []byte("vms:\n  \"bad name\":\n    networks:\n      - vmnet: shared\n        macAddress: nope\n"), VMFileOptions{})
	verrs := vdiags.Errors()
	if len(verrs) != 2 || !strings.Contains(verrs[0].String()+verrs[1].String(), "macAddress") {
		t.Errorf("a VM with a bad name and a bad MAC: %d errors: %v", len(verrs), verrs)
	}
}

// TestNetworkSocketKey: `socket: true` is a routed network's; a bridged
// one has no ports of vmnetctl's to give, and says so at the line.
func TestNetworkSocketKey(t *testing.T) {
	nets, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  s:\n    mode: shared\n    subnet: 10.71.0.0/24\n    socket: true\n"))
	if err := diags.Err(); err != nil || !nets.Get("s").Socket {
		t.Fatalf("socket: true on a shared network: %v %+v", err, nets)
	}
	_, diags = LoadNetworks("n.yaml", []byte("vmnet:\n  b:\n    mode: bridged\n    interface: eth0\n    socket: true\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:5") {
		t.Errorf("socket: true on a bridged network: %v", err)
	}
}

// TestYAMLErrorsSayWhat: a tab says it is a tab and what to do, at its
// line; bytes that are not UTF-8 are found at their line; a VM name with
// a dot is told no dots, not that dots are allowed; nesting too deep is
// told at the line where it starts, in either file.
func TestYAMLErrorsSayWhat(t *testing.T) {
	_, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  a:\n\tmode: host\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:3") || !strings.Contains(err.Error(), "tab") || !strings.Contains(err.Error(), "spaces") {
		t.Errorf("a tab: %v", err)
	}
	_, diags = LoadNetworks("n.yaml", []byte("vmnet:\n  a:\n    mode: h\xffst\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:3") || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("not UTF-8: %v", err)
	}
	_, vdiags := LoadVMFile("v.yaml", []byte("vms:\n  a.b:\n    networks: [{vmnet: shared}]\n"), VMFileOptions{})
	if err := vdiags.Err(); err == nil || !strings.Contains(err.Error(), "no dots") {
		t.Errorf("a VM name with a dot: %v", err)
	}
	// Nesting too deep for the parser: the line where it starts.
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	_, vdiags = LoadVMFile("v.yaml", []byte("vms:\n  a:\n    networks:\n      - vmnet: "+deep+"\n"), VMFileOptions{})
	if err := vdiags.Err(); err == nil || !strings.Contains(err.Error(), "v.yaml:4") || !strings.Contains(err.Error(), "depth") {
		t.Errorf("nesting too deep in a VM file: %v", err)
	}
	_, diags = LoadNetworks("n.yaml", []byte("vmnet:\n  a: "+deep+"\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "n.yaml:2") || !strings.Contains(err.Error(), "depth") {
		t.Errorf("nesting too deep in networks.yaml: %v", err)
	}
}
