package netplane

import "sync/atomic"

// A Watch is the controller's watch of the kernel's networks
// (WatchChanges).
type Watch struct {
	// C reports the changes the controller should look at: a send, a
	// change that comes while one is pending folded into it.
	C <-chan struct{}

	notices atomic.Uint64
	deaf    atomic.Bool
}

// Notices counts the notices the kernel sent that may concern a network's
// VM ports (portNotice: a vmnetctl link, a port of a vmnetctl bridge;
// ourTables: anything in a vmnetctl nftables table), and each time some
// were lost; ok is false once the watch stopped reading one of its
// sockets, when the count tells nothing. It counts the notices as the
// watch reads them, a moment after the kernel sent them (longer if the
// reader lags): while it stands, no TAP left its bridge or went and no
// guard's set, rule or table changed before the notices read so far, and
// what a full pass read of the ports before them still holds (the
// controller's settled).
func (w *Watch) Notices() (n uint64, ok bool) {
	return w.notices.Load(), !w.deaf.Load()
}
