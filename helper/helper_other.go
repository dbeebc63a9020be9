//go:build !linux

package helper

import (
	"context"
	"os/exec"

	"github.com/vmnetctl/vmnetctl/api"
)

// Run is Linux only: elsewhere vmnetctl runs vmnet-helper.
func Run(context.Context, Options) error { return errNotLinux }

func relearnMAC(context.Context, Options) error { return errNotLinux }

// Program is exe: vmnetctl-relay is Linux's.
func Program(exe string) string { return exe }

// Prepared is Linux's: Prepare sets up no helper elsewhere.
type Prepared struct {
	Cmd *exec.Cmd
	Log []byte
}

// Prepare sets up no helper: vmnetctl-relay is Linux's.
func Prepare([]string, *api.Network) (*Prepared, error) { return nil, nil }

// Release has nothing to release.
func (*Prepared) Release() {}

// AfterExit: nothing is kept.
func (*Prepared) AfterExit() func() { return nil }
