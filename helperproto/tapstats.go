package helperproto

import "time"

// HeartbeatIntervals is how many stats intervals a helper whose counters
// do not move waits between two stats lines, and the controller between
// two samples of a held TAP's counters that do not move: 5 minutes at the
// default 5 s. Each line wakes an idle helper (about a millisecond of CPU
// here, a few Go threads woken): at 30 s, 3,000 idle helpers took a tenth
// of this 2-CPU machine.
const HeartbeatIntervals = 60

// TapCounts are the kernel's counters of a TAP a VMM drives (`attach:
// tap`), as read at one instant: rx is what the VMM wrote into the TAP
// (the VM sent), tx what the kernel gave it; Held says a VMM holds the
// TAP (its carrier is on: IFF_LOWER_UP).
type TapCounts struct {
	RxPackets, RxBytes, RxDropped uint64
	TxPackets, TxBytes, TxDropped uint64
	Held                          bool
}

// TapMeter turns a TAP's counts, read now and then, into a helper's
// stats (one owner of the rule, for the relay that holds a TAP and for a
// controller that reads its TAPs' counters itself). Frames the kernel
// drops towards a TAP no VMM holds (no reader) are not drops of the
// helper's: a VM that is not running takes no frames. Drops are counted
// only while a VMM holds the TAP, as far as the reads tell: those since
// the last read are the VMM's if it holds the TAP now. Its zero value is
// ready for a new TAP (its counters start at 0); a new TAP needs a new
// meter, and a TAP met late (a helper adopted by a controller started
// again) one that FromFirstRead.
type TapMeter struct {
	lastTx, noReader uint64
	// late: the drops of the first read are none of the helper's (who
	// held the TAP before is not known): its drops count from there.
	late, read bool
	// last are the counts of the last sample (Stats), quiet how many
	// reads since found them unchanged (Due).
	last  TapCounts
	quiet int
}

// TapMeterFromFirstRead is a meter of a TAP that has counted for a while:
// its drops count from its first read on.
func TapMeterFromFirstRead() TapMeter { return TapMeter{late: true} }

// Due says whether counts c, just read, make a new sample (Stats), as a
// relay writes a stats line: the first read, counts that moved since the
// last sample, and one every HeartbeatIntervals reads that found them
// unchanged (so that rates fall to 0 and the sample's time says when they
// last moved). A read that is not due is only counted.
func (m *TapMeter) Due(c TapCounts) bool {
	if m.read && c == m.last && m.quiet < HeartbeatIntervals {
		m.quiet++
		return false
	}
	return true
}

// Stats are the stats of counts c read at t: a sample.
func (m *TapMeter) Stats(c TapCounts, t time.Time) Stats {
	if m.late && !m.read {
		m.noReader, m.lastTx = c.TxDropped, c.TxDropped
	}
	m.read, m.last, m.quiet = true, c, 0
	if !c.Held && c.TxDropped > m.lastTx {
		m.noReader += c.TxDropped - m.lastTx
	}
	m.lastTx = c.TxDropped
	return Stats{
		Time: t,
		Host: Counters{Packets: c.TxPackets, Bytes: c.TxBytes, Drops: c.TxDropped - m.noReader},
		VM:   Counters{Packets: c.RxPackets, Bytes: c.RxBytes, Drops: c.RxDropped},
	}
}
