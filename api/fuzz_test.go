package api

import (
	"os"
	"path/filepath"
	"testing"
)

// addSeeds adds every YAML file under the repository's examples/ and config/
// directories to the fuzz corpus.
func addSeeds(f *testing.F) {
	for _, pattern := range []string{"../config/*.yaml", "../examples/*.yaml", "../examples/*/*.yaml"} {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte(testNetworks))
	f.Add([]byte("vms:\n  a:\n    networks:\n      - vmnet: lab\n        ip: 10.10.0.7\n        attach: tap\n"))
	f.Add([]byte("a: &x [*x]\n"))
}

// FuzzLoadNetworks checks that no input panics the loader and that whatever
// it accepts is internally consistent.
func FuzzLoadNetworks(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		nets, diags := LoadNetworks("fuzz.yaml", data)
		if (nets == nil) != diags.HasErrors() {
			t.Fatalf("networks %v but errors %v", nets != nil, diags.HasErrors())
		}
		if nets == nil {
			return
		}
		for _, n := range nets.Networks {
			if len(n.Bridge()) > MaxIfNameLen {
				t.Errorf("bridge name %q too long", n.Bridge())
			}
			if !n.Routed() {
				continue
			}
			for _, a := range []struct {
				name string
				ok   bool
			}{
				{"gateway", n.Subnet.Contains(n.Gateway)},
				{"dhcpStart", n.Subnet.Contains(n.DHCPStart)},
				{"dhcpEnd", n.Subnet.Contains(n.DHCPEnd)},
				{"range order", !n.DHCPEnd.Less(n.DHCPStart)},
				{"mtu", n.MTU >= MinMTU && n.MTU <= MaxMTU},
			} {
				if !a.ok {
					t.Errorf("network %s: %s is inconsistent: %+v", n.ID, a.name, n)
				}
			}
			for _, r := range n.Reservations {
				if !n.Subnet.Contains(r.IP) {
					t.Errorf("network %s: reservation %s outside %s", n.ID, r.IP, n.Subnet)
				}
			}
		}
	})
}

// FuzzLoadVMFile checks that no input panics the VM file loader or Resolve,
// and that every accepted attachment is usable.
func FuzzLoadVMFile(f *testing.F) {
	addSeeds(f)
	nets, _ := LoadNetworks("networks.yaml", []byte(testNetworks))
	f.Fuzz(func(t *testing.T, data []byte) {
		vf, diags := LoadVMFile("fuzz/lima.yaml", data, VMFileOptions{})
		if vf == nil {
			if !diags.HasErrors() {
				t.Fatalf("no file and no error")
			}
			return
		}
		diags = append(diags, Resolve(nets, []*VMFile{vf})...)
		if diags.HasErrors() {
			return
		}
		for _, vm := range vf.VMs {
			if checkName(vm.Name) != "" {
				t.Errorf("accepted VM name %q", vm.Name)
			}
			for _, a := range vm.Attachments {
				if _, msg := parseMAC(a.MAC); msg != "" {
					t.Errorf("accepted MAC %q: %s", a.MAC, msg)
				}
				if nets.Get(a.Network) == nil {
					t.Errorf("attachment to unknown network %q", a.Network)
				}
			}
		}
	})
}
