package controller

// DefaultBackend is the platform's backend: on Linux, vmnetctl's own data
// plane and helper.
func DefaultBackend() Backend { return linuxBackend{} }
