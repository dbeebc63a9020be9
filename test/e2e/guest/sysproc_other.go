//go:build !linux

package guest

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

func setpgid(a *syscall.SysProcAttr) {}

func killGroup(pgid int, hard bool) {}
