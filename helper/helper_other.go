//go:build !linux

package helper

import "context"

// Run is Linux only: elsewhere vmnetctl runs vmnet-helper.
func Run(context.Context, Options) error { return errNotLinux }

func relearnMAC(context.Context, Options) error { return errNotLinux }

// RelearnFlag is the hidden flag of the Linux helper's relearn command.
const RelearnFlag = "relearn-mac"
