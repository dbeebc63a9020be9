package guest

import "syscall"

// sysProcAttr makes the kernel kill qemu if the test process dies, so no
// guest outlives `go test`.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
