// Package overlaytest holds the fixtures of the overlay's tests and of the
// network's tests across hosts: one network across three hosts, over a
// plain underlay or through WireGuard, and one host of it in a namespace.
package overlaytest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
	"github.com/vmnetctl/vmnetctl/wgkey"
)

// VXLANYAML is one shared network across three hosts, 10.77.0.1-3 on an
// underlay of their own; each serves a third of .2-.100.
const VXLANYAML = `networks:
  lab:
    mode: shared
    gateway: 10.200.50.1
    dhcpEnd: 10.200.50.100
    netmask: 255.255.255.0
    vxlan:
      vni: 4242
      hosts:
        - {name: h1, address: 10.77.0.1}
        - {name: h2, address: 10.77.0.2}
        - {name: h3, address: 10.77.0.3}
`

// WireGuardYAML is VXLANYAML's network with the underlay encrypted; KEYn are the
// hosts' public keys.
const WireGuardYAML = `networks:
  lab:
    mode: shared
    gateway: 10.200.51.1
    dhcpEnd: 10.200.51.100
    netmask: 255.255.255.0
    vxlan:
      vni: 4243
      wireguard: {subnet: 10.255.77.0/24}
      hosts:
        - {name: h1, address: 10.77.0.1, publicKey: "KEY1"}
        - {name: h2, address: 10.77.0.2, publicKey: "KEY2"}
        - {name: h3, address: 10.77.0.3, publicKey: "KEY3"}
`

// Lab is VXLANYAML's network lab, and a host namespace (named
// prefix) whose interface "underlay" has address, for the tests that need
// one host of the segment.
func Lab(t testing.TB, prefix, address string) (*testutil.NS, *api.Network) {
	t.Helper()
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip")
	host := testutil.NewNS(t, prefix)
	host.MustRun(t, "ip", "link", "add", "underlay", "up", "type", "veth", "peer", "name", "ul-peer")
	host.MustRun(t, "ip", "addr", "add", address, "dev", "underlay")
	nets := testutil.LoadNetworks(t, VXLANYAML)
	return host, nets.Get("lab")
}

// WireGuardHostOne is WireGuardYAML's network "lab" as host 1 sees it: a state dir with
// host 1's key in it, and the network with that key listed (the others'
// made up).
func WireGuardHostOne(t testing.TB) (dir string, n *api.Network) {
	t.Helper()
	dir = t.TempDir()
	k, err := wgkey.LoadOrCreate(statedir.Dir{Path: dir}.WireGuardKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(WireGuardYAML, "KEY1", k.Public().String(), 1)
	for _, i := range []int{2, 3} {
		other, _ := wgkey.Generate()
		src = strings.Replace(src, fmt.Sprintf("KEY%d", i), other.Public().String(), 1)
	}
	nets := testutil.LoadNetworks(t, src)
	return dir, nets.Get("lab")
}
