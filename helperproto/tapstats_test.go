package helperproto

import (
	"testing"
	"time"
)

// TestTapMeter: the kernel's drops towards a TAP count as the helper's
// only while a VMM holds it; rx and tx are the VM's and the host's.
func TestTapMeter(t *testing.T) {
	var m TapMeter
	now := time.Now()
	steps := []struct {
		c         TapCounts
		hostDrops uint64
	}{
		{TapCounts{TxDropped: 5}, 0},                                        // no VMM yet: its 5 are not the helper's
		{TapCounts{TxDropped: 9, Held: true}, 4},                            // held now: the 4 since are
		{TapCounts{TxDropped: 20}, 4},                                       // let go: none of the 11 since
		{TapCounts{TxDropped: 21, TxPackets: 3, RxBytes: 7, Held: true}, 5}, // held again
	}
	for i, s := range steps {
		st := m.Stats(s.c, now)
		if st.Host.Drops != s.hostDrops || st.Host.Packets != s.c.TxPackets || st.VM.Bytes != s.c.RxBytes || !st.Time.Equal(now) {
			t.Errorf("step %d: %+v, want host drops %d", i, st, s.hostDrops)
		}
	}
}

// TestTapMeterFromFirstRead: a TAP met late counts its drops from its
// first read on, whoever held it before.
func TestTapMeterFromFirstRead(t *testing.T) {
	m := TapMeterFromFirstRead()
	if st := m.Stats(TapCounts{TxDropped: 50, Held: true}, time.Now()); st.Host.Drops != 0 {
		t.Errorf("first read of a TAP met late: %d drops, want 0", st.Host.Drops)
	}
	if st := m.Stats(TapCounts{TxDropped: 53, Held: true}, time.Now()); st.Host.Drops != 3 {
		t.Errorf("then 3 more while held: %d drops, want 3", st.Host.Drops)
	}
}

// TestTapMeterDue: a sample is due at the first read, when the counts
// moved, and every HeartbeatIntervals reads that found them unchanged.
func TestTapMeterDue(t *testing.T) {
	var m TapMeter
	c := TapCounts{RxPackets: 1}
	if !m.Due(c) {
		t.Fatal("the first read is not due")
	}
	m.Stats(c, time.Now())
	for i := range HeartbeatIntervals {
		if m.Due(c) {
			t.Fatalf("unchanged read %d is due", i+1)
		}
	}
	if !m.Due(c) {
		t.Error("the heartbeat is not due")
	}
	m.Stats(c, time.Now())
	if c.RxPackets++; !m.Due(c) {
		t.Error("moved counts are not due")
	}
}
