// Package guard is each network's port guard on its bridge (nftables,
// bridge family): a VM's port may send only from its MAC and the
// addresses the network gave it, whatever frames its guest writes; the
// tunnel port of a network across hosts only what the tunnel's rules let
// through; and what it drops is counted.
package guard
