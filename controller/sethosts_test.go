package controller

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/spec"
)

// hostsCounter is a network that records the VMs SetHost was told of.
type hostsCounter struct {
	backend.Network
	told []string
}

func (h *hostsCounter) SetHost(_ net.HardwareAddr, name string, _ netip.Addr) error {
	h.told = append(h.told, name)
	return nil
}

func (h *hostsCounter) SetVMs([]string, []net.HardwareAddr) {}

// TestSetHostsTellsChanges: a pass asked for tells a network only of the
// attachments new or changed since the last (a VM more costs one SetHost,
// not one for every VM that runs); a full pass, and a network started
// again, are told of every one.
func TestSetHostsTellsChanges(t *testing.T) {
	c := &Controller{nets: map[string]backend.Network{}}
	nw := &hostsCounter{}
	c.nets["n"] = nw
	att := func(vm, ip string) *spec.Attachment {
		a := &api.Attachment{VM: vm, Network: "n", MAC: "52:55:55:00:00:0" + vm[:1]}
		if ip != "" {
			a.IP = netip.MustParseAddr(ip)
		}
		return &spec.Attachment{Attachment: a}
	}
	pass := func(full bool, atts ...*spec.Attachment) []string {
		t.Helper()
		nw := c.nets["n"].(*hostsCounter)
		nw.told = nil
		if errs := c.setHosts(&spec.Desired{Attachments: atts}, full); len(errs) > 0 {
			t.Fatal(errs)
		}
		slices.Sort(nw.told)
		return nw.told
	}
	a, b := att("a", ""), att("b", "")
	for _, tc := range []struct {
		name string
		full bool
		atts []*spec.Attachment
		want []string
	}{
		{"the first pass", false, []*spec.Attachment{a, b}, []string{"a", "b"}},
		{"nothing changed", false, []*spec.Attachment{a, b}, nil},
		{"c attached", false, []*spec.Attachment{a, b, att("c", "")}, []string{"c"}},
		{"b's fixed address", false, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"b"}},
		{"a full pass", true, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"a", "b", "c"}},
		{"c detached, then back", false, []*spec.Attachment{a, att("b", "10.0.0.9")}, nil},
		{"c back", false, []*spec.Attachment{a, att("b", "10.0.0.9"), att("c", "")}, []string{"c"}},
	} {
		if got := pass(tc.full, tc.atts...); !slices.Equal(got, tc.want) {
			t.Errorf("%s: told of %v, want %v", tc.name, got, tc.want)
		}
	}
	c.nets["n"] = &hostsCounter{} // the network started again
	if got := pass(false, a, att("b", "10.0.0.9")); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a network started again: told of %v, want a and b", got)
	}
}
