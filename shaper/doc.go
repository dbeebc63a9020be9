// Package shaper limits the bandwidth of a VM's port in the kernel: a
// token bucket (tc tbf) on what the port sends the VM, a policer (tc
// ingress, matchall, police) on what the VM sends.
package shaper
