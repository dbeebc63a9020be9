package guest

import "syscall"

// sysProcAttr makes the kernel kill qemu if the test process dies, so no
// guest outlives `go test`.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

func setpgid(a *syscall.SysProcAttr) { a.Setpgid = true }

// killGroup sends SIGTERM (or SIGKILL if hard) to the process group pgid.
func killGroup(pgid int, hard bool) {
	sig := syscall.SIGTERM
	if hard {
		sig = syscall.SIGKILL
	}
	syscall.Kill(-pgid, sig)
}
