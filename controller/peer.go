package controller

import "net"

// peerUID is the uid of the process at the other end of a unix socket
// connection, as the kernel tells it (peerCredUID).
func peerUID(conn net.Conn) (int, bool) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var uid int
	var cerr error
	if err := raw.Control(func(fd uintptr) { uid, cerr = peerCredUID(int(fd)) }); err != nil || cerr != nil {
		return 0, false
	}
	return uid, true
}
