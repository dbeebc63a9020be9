//go:build !linux

package helper

import "context"

// Run is Linux only: elsewhere vmnetctl runs vmnet-helper.
func Run(context.Context, Options) error { return errNotLinux }

func relearnMAC(context.Context, Options) error { return errNotLinux }

// Program is exe: vmnetctl-relay is Linux's.
func Program(exe string) string { return exe }
