package controller

import (
	"hash/maphash"

	"github.com/vmnetctl/vmnetctl/spec"
)

// settled tells a full pass whether it may leave the VM ports unread: the
// bridges' ports (ensurePorts) and the guards' claims read again
// (claimPorts' Reread), three fifths of an idle fleet's controller's CPU
// at 10,000 VMs. It may when the watch (backend.Watcher's notices)
// counted nothing of the ports since a full pass that read them all
// began, and that pass found them as they should be or put them back: a
// TAP that left its bridge or went, a guard's element, rule or table
// deleted, each is a notice, and a notice lost is counted too. The count
// is of the notices the watch has read: one the kernel sent just before a
// pass began and the watch reads after is the next pass's, a resync
// later. The helpers whose ports a pass checks must be those that pass
// checked (ports: their digest), and at most settledSkips full passes in
// a row skip, a backstop for what the kernel changes without a word. The
// network's own check (repairNetworks) runs on every full pass as before:
// sysctls, routes and FRR send no notice.
type settled struct {
	notices func() (n uint64, ok bool) // nil: no watch
	seed    maphash.Seed

	ok    bool   // a full pass that read the ports began at mark, and found them clean
	mark  uint64 // the watch's count when it began
	ports uint64 // its ports' digest (portsDigest)
	skips int    // full passes since that skipped the ports

	read, unread uint64 // full passes that read the ports, and that did not
}

// settledSkips is how many full passes in a row may leave the ports
// unread: every tenth reads them (at the default resync and a fleet that
// does nothing else, every five minutes).
const settledSkips = 9

// settledPass is what a full pass knew, as it began, of its ports.
type settledPass struct {
	quiet   bool   // it may leave them unread
	counted bool   // the watch counts (n is its count)
	n       uint64 // the watch's count then
	ports   uint64
}

// begin tells a full pass whether it may leave the ports unread; ports is
// their digest now. Call before the pass reads anything of the kernel's.
func (s *settled) begin(ports uint64) settledPass {
	var p settledPass
	if s.notices != nil {
		n, ok := s.notices()
		p = settledPass{counted: ok, n: n, ports: ports}
		p.quiet = ok && s.ok && n == s.mark && ports == s.ports && s.skips < settledSkips
	}
	if p.quiet {
		s.skips++
		s.unread++
	} else {
		s.read++
	}
	return p
}

// end records a full pass that began as p: one that read the ports and
// found them clean (none of its port checks or claims failed) is the mark
// the next passes are measured from; one that failed them (a settled one
// too: those of the networks it started or repaired) is none.
func (s *settled) end(p settledPass, clean bool) {
	if p.quiet && clean {
		return
	}
	if !p.counted || !clean {
		s.ok = false
		return
	}
	s.ok, s.mark, s.ports, s.skips = true, p.n, p.ports, 0
}

// portsDigest is a digest of the ports a full pass checks (runningPorts):
// their networks, names, MAC pins and spoof checks.
func (c *Controller) portsDigest(desired *spec.Desired) uint64 {
	if c.settle.seed == (maphash.Seed{}) {
		c.settle.seed = maphash.MakeSeed()
	}
	var h maphash.Hash
	h.SetSeed(c.settle.seed)
	for network, p := range c.runningPorts(desired) {
		h.WriteString(network)
		h.WriteByte(0)
		h.WriteString(p.Name)
		h.WriteByte(byte(len(p.MAC)))
		h.Write(p.MAC)
		if p.SpoofCheck {
			h.WriteByte(1)
		} else {
			h.WriteByte(0)
		}
	}
	return h.Sum64()
}
