package helper

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/guard"
)

// checkSudoPort refuses, through sudo, a port name that an attachment of
// the network is expected on (the controller claimed it): taking it would
// let the caller's VM learn that attachment's MAC.
func checkSudoPort(n *api.Network, port string) error {
	if !throughSudo() {
		return nil
	}
	// A VM port's name only: not a network's bridge or VXLAN device to
	// come, nor an interface of the host's that is not there yet.
	if !strings.HasPrefix(port, api.TapPrefix) {
		return fmt.Errorf("TAP %s: run through sudo, the helper makes only TAPs named %s and an id", port, api.TapPrefix)
	}
	expected, err := guard.ExpectedPort(context.Background(), n, port)
	if err != nil {
		return err
	}
	if expected {
		return fmt.Errorf("TAP %s is the port of a VM attachment of network %q (its --interface-id or --tap is that VM's): run through sudo, the helper may not take it", port, n.ID)
	}
	return nil
}
