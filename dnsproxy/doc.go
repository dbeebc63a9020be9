// Package dnsproxy answers a network's VMs over DNS: their own names under
// vmnet.internal, the rest from the host's resolvers, within bounds that a
// guest flooding it cannot pass.
package dnsproxy
