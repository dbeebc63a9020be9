package controller

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/backend"
)

// A network across hosts with EVPN: status says how many of its BGP
// sessions are established, under the tunnel's line; without EVPN it says
// nothing of BGP.
func TestStatusTunnelEVPN(t *testing.T) {
	tun := &backend.TunnelStats{Host: "h1", Peers: []string{"10.0.0.2"}, RemoteMACs: 1,
		BGPSessions: map[string]string{"10.0.0.2": "Established", "10.0.0.3": "Active"}}
	st := &Status{Networks: []NetworkStatus{{Name: "lab", Mode: "shared", Bridge: "vmn-lab", State: "up", Tunnel: tun}}}
	var out bytes.Buffer
	if err := st.render(&out, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "lab's EVPN: 1 of 2 BGP sessions established\n") {
		t.Errorf("status without the EVPN sessions:\n%s", out.String())
	}
	tun.BGPSessions = nil
	out.Reset()
	st.render(&out, time.Now())
	if strings.Contains(out.String(), "BGP") {
		t.Errorf("status of static peers speaks of BGP:\n%s", out.String())
	}
}
