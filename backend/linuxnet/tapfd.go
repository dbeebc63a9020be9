package linuxnet

import (
	"os"

	"github.com/vmnetctl/vmnetctl/netplane"
)

// OpenTAP opens an `attach: tap` port's TAP for a VMM (netplane.OpenTAP).
func (Backend) OpenTAP(name string) (*os.File, error) { return netplane.OpenTAP(name) }

// Vhost reports whether the host has vhost-net.
func (Backend) Vhost() bool { return netplane.VhostNet() }

// OpenVhost opens vhost-net for a VMM.
func (Backend) OpenVhost() (*os.File, error) { return netplane.OpenVhostNet() }
