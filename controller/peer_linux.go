package controller

import "golang.org/x/sys/unix"

// peerCredUID reads the peer's uid of unix socket fd (SO_PEERCRED).
func peerCredUID(fd int) (int, error) {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, err
	}
	return int(cred.Uid), nil
}
