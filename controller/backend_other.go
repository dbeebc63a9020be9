//go:build !linux

package controller

import "os"

// DefaultBackend is the platform's backend: elsewhere (macOS), vmnet and
// vmnet-helper, through sudo unless the controller is root.
func DefaultBackend() Backend { return VMNetHelperBackend{Sudo: os.Geteuid() != 0} }
