package hostnet

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// LinkDeletion hears of one link's deletion, and of nothing else: the
// kernel filters the link notices of its namespace (a classic BPF program
// on the socket) down to RTM_DELLINK of the link's interface index. A
// process that waits for its link to go (a helper of `attach: tap`, one
// a VM of a fleet) is then not woken, nor made to parse, by every other
// link a fleet makes and deletes: with a plain subscription, each of N
// such helpers read every notice of the others, N squared a fleet's up.
type LinkDeletion struct{ s *nl.NetlinkSocket }

// WatchLinkDeletion starts hearing of the deletion of the link of
// interface index in the current namespace. A deletion before the call is
// not heard: look for the link once the watch is on.
func WatchLinkDeletion(index int) (*LinkDeletion, error) {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK)
	if err != nil {
		return nil, fmt.Errorf("watching link %d: %w", index, err)
	}
	prog := deletionFilter(uint32(index))
	if err := unix.SetsockoptSockFprog(s.GetFd(), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		s.Close()
		return nil, fmt.Errorf("watching link %d: filtering its notices: %w", index, err)
	}
	return &LinkDeletion{s}, nil
}

// deletionFilter keeps the link notices that are RTM_DELLINK of interface
// index and drops the others. A notice is one message (nlmsghdr, then
// ifinfomsg, whose ifi_index is at 20); a filter loads in network order,
// the message is in the host's: the values compared are as it loads them.
func deletionFilter(index uint32) []unix.SockFilter {
	var b [4]byte
	binary.NativeEndian.PutUint16(b[:2], unix.RTM_DELLINK)
	typ := uint32(binary.BigEndian.Uint16(b[:2]))
	binary.NativeEndian.PutUint32(b[:], index)
	idx := binary.BigEndian.Uint32(b[:])
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 4},                  // nlmsg_type
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: typ}, // not a deletion: drop
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 20},                 // ifi_index
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: idx}, // another link's: drop
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// Wait returns once a notice of the deletion came (nil), or with the
// socket's error: ENOBUFS when notices were lost, another once the watch
// is closed or broken. A notice that came before the filter was on may
// be another link's: on nil, or ENOBUFS, look whether the link is there.
func (w *LinkDeletion) Wait() error {
	for {
		msgs, _, err := w.s.Receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.RTM_DELLINK {
				return nil
			}
		}
	}
}

// Close ends the watch; a Wait under way returns.
func (w *LinkDeletion) Close() { w.s.Close() }

// ErrNoticesLost is whether err, from Wait, says notices were lost.
func ErrNoticesLost(err error) bool { return errors.Is(err, unix.ENOBUFS) }
