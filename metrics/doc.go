// Package metrics holds what the controller's Prometheus metrics and
// `vmnetctl status` compute from raw readings, without any controller
// state: a helper process's CPU time and memory from the kernel, rates from
// a helper's cumulative stats lines, and the size of a DHCP pool. The
// collector itself lives in package controller, next to the state it reads.
package metrics
