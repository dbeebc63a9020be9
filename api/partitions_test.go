package api

import (
	"reflect"
	"strings"
	"testing"
)

// TestPartitions: a routed network's partitions read as groups of VM
// names; a VM in two groups, a bad name, one group alone or a partition
// of a bridged network is refused at its line and field.
func TestPartitions(t *testing.T) {
	load := func(p string) (*Network, error) {
		nets, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  lab:\n    subnet: 10.70.0.0/24\n    partitions: "+p+"\n"))
		if err := diags.Err(); err != nil {
			return nil, err
		}
		return nets.Get("lab"), nil
	}
	n, err := load("[[a, b], [c]]")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Partitions{{"a", "b"}, {"c"}}); !reflect.DeepEqual(n.Partitions, want) {
		t.Errorf("partitions %v, want %v", n.Partitions, want)
	}
	if g := n.Partitions.Group("B"); g != 0 {
		t.Errorf("B's group: %d, want 0 (names are DNS names: case does not count)", g)
	}
	if g := n.Partitions.Group("d"); g != -1 {
		t.Errorf("d's group: %d, want -1 (in none)", g)
	}
	if s := n.Partitions.String(); s != "[a, b], [c]" {
		t.Errorf("String: %q", s)
	}
	for _, tc := range []struct{ p, want string }{
		{"[[a, b], [b, c]]", `n.yaml:4: vmnet.lab.partitions[1][0]: VM "b" is in two groups (also at vmnet.lab.partitions[0][1])`},
		{"[[a], [c.d]]", "vmnet.lab.partitions[1][0]: VM name"},
		{"[[a, b]]", "vmnet.lab.partitions: cuts nothing: give two groups or more"},
		{"[a, b]", "vmnet.lab.partitions[0]: must be a list of VM names"},
		{"a", "vmnet.lab.partitions: must be a list of groups of VM names"},
	} {
		if _, err := load(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.p, err, tc.want)
		}
	}
	_, diags := LoadNetworks("n.yaml", []byte("vmnet:\n  lan:\n    mode: bridged\n    interface: eth0\n    partitions: [[a], [b]]\n"))
	if err := diags.Err(); err == nil || !strings.Contains(err.Error(), "a bridged network has no partitions") {
		t.Errorf("partitions of a bridged network: %v", err)
	}
}
