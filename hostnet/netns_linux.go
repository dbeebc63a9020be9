package hostnet

import "golang.org/x/sys/unix"

// NetNS identifies a network namespace: the device and inode of its file
// (/proc/PID/ns/net, a /run/netns/NAME mount of it).
type NetNS struct{ Dev, Ino uint64 }

// ThreadNetNS is the network namespace of the calling OS thread, and
// false when it cannot be read. Go moves a goroutine between threads: a
// caller that acts on the answer with later calls locks its thread
// (runtime.LockOSThread) around both.
func ThreadNetNS() (NetNS, bool) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return NetNS{}, false
	}
	return NetNS{Dev: st.Dev, Ino: st.Ino}, true
}
