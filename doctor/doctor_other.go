//go:build !linux

package doctor

import (
	"context"
	"os"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend/vmnethelper"
)

func preflight() []check { return []check{checkVMNetHelper} }

func checks() []check { return preflight() }

// checkVMNetHelper: on macOS the helper is vmnet-helper, installed where
// vmnetctl finds it and, since it runs as root through sudo, changeable by
// root only.
func checkVMNetHelper(_ context.Context, nets []*api.Network) []Finding {
	path, err := vmnethelper.Find("", os.Stat)
	if err != nil {
		return []Finding{{Check: "vmnet-helper", Status: Fail, Detail: err.Error(),
			Fix: "install vmnet-helper (https://github.com/nirs/vmnet-helper: its install script, or brew install vmnet-helper)"}}
	}
	if err := vmnethelper.CheckRootOwned(path); err != nil {
		// A problem when it runs through sudo (before macOS 26).
		return []Finding{{Check: "vmnet-helper", Status: Warn, Detail: err.Error(),
			Fix: "reinstall vmnet-helper with its install script, which puts it under /opt/vmnet-helper owned by root"}}
	}
	return []Finding{{Check: "vmnet-helper", Status: OK, Detail: path + ", owned by root"}}
}
