//go:build !linux

package controller

// DefaultBackend is the platform's backend: elsewhere (macOS), vmnet and
// vmnet-helper.
func DefaultBackend() Backend { return linuxBackend{} }
