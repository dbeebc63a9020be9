package ops

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// A network across hosts with EVPN: status says how many of its BGP
// sessions are established, under the tunnel's line; without EVPN it says
// nothing of BGP.
func TestStatusTunnelEVPN(t *testing.T) {
	tun := &backend.TunnelStats{Host: "h1", Peers: []string{"10.0.0.2"}, RemoteMACs: 1,
		BGPSessions: map[string]string{"10.0.0.2": "Established", "10.0.0.3": "Active"}, BGPPeers: 2}
	st := &ctlapi.Status{Networks: []ctlapi.NetworkStatus{{Name: "lab", Mode: "shared", Bridge: "vmn-lab", State: "up", Tunnel: tun}}}
	var out bytes.Buffer
	if err := renderStatus(&out, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "lab's EVPN: 1 of 2 BGP sessions established\n") {
		t.Errorf("status without the EVPN sessions:\n%s", out.String())
	}
	// FRR lost its configuration: no session at all is 0 of the 2 hosts;
	// FRR not answering is said.
	for _, tc := range []struct {
		sessions map[string]string
		err      string
		want     string
	}{
		{map[string]string{}, "", "lab's EVPN: 0 of 2 BGP sessions established\n"},
		{nil, "", "lab's EVPN: 2 BGP sessions, not read from FRR yet\n"},
		{nil, "FRR is not running: bgpd is not running", "lab's EVPN: 0 of 2 BGP sessions established (FRR: FRR is not running: bgpd is not running)\n"},
	} {
		tun.BGPSessions, tun.BGPError = tc.sessions, tc.err
		out.Reset()
		renderStatus(&out, st, time.Now())
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("status with sessions %v and error %q lacks %q:\n%s", tc.sessions, tc.err, tc.want, out.String())
		}
	}
	tun.BGPSessions, tun.BGPError, tun.BGPPeers = nil, "", 0
	out.Reset()
	renderStatus(&out, st, time.Now())
	if strings.Contains(out.String(), "BGP") {
		t.Errorf("status of static peers speaks of BGP:\n%s", out.String())
	}
}
