package controller

import (
	"fmt"
	"syscall"

	"github.com/vmnetctl/vmnetctl/api"
)

// openFilesNeeded is what a controller of api.MaxAttachments helpers
// may hold open: a pidfd each (procid.Child), and room for its netlink
// and nftables sockets, its API's connections and its files.
const openFilesNeeded = api.MaxAttachments + 4096

// openFilesWanted is that, and room for a second descriptor an
// attachment (a fleet of `attach: tap` VMs kept a cleanup child's pidfd
// each before their TAPs went to one link reaper).
const openFilesWanted = 2*api.MaxAttachments + 4096

// raiseOpenFiles lifts the limit on this process's open files to
// openFilesWanted where it is lower (Go has already raised the soft limit
// to the hard one): a root controller may raise the hard limit too, and a
// hard limit of 4,096, as some systems set, would fail the 4,000th
// helper with "too many open files". It fails only when the limit stays
// below openFilesNeeded.
func raiseOpenFiles() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= openFilesWanted {
		return nil
	}
	want := syscall.Rlimit{Cur: openFilesWanted, Max: max(l.Max, openFilesWanted)}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
	if err != nil && l.Cur < openFilesNeeded {
		return fmt.Errorf("open files limited to %d (%d wanted for %d attachments): %w", l.Cur, uint64(openFilesNeeded), api.MaxAttachments, err)
	}
	return nil
}
