// Package capture copies a VM port's frames as they pass to a pcapng
// stream, through a packet socket of its own: the VM is never slowed, and
// what a slow reader cannot take the kernel drops and counts.
package capture
