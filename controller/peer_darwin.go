package controller

import "golang.org/x/sys/unix"

// peerCredUID reads the peer's uid of unix socket fd (LOCAL_PEERCRED).
func peerCredUID(fd int) (int, error) {
	cred, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil {
		return 0, err
	}
	return int(cred.Uid), nil
}
