package backends

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/backend/linuxnet"
	"github.com/vmnetctl/vmnetctl/backend/vmnethelper"
)

// Default is the platform's backend: on Linux vmnetctl's own data
// plane and helper; elsewhere (macOS) vmnet and vmnet-helper, through sudo
// unless the controller is root.
func Default() backend.Backend {
	if runtime.GOOS == "linux" {
		return linuxnet.Backend{}
	}
	return vmnethelper.Backend{Sudo: os.Geteuid() != 0}
}

// Names are the names --backend accepts.
var Names = []string{linuxnet.Name, vmnethelper.Name}

// ByName is the backend --backend names.
func ByName(name string) (backend.Backend, error) {
	switch name {
	case linuxnet.Name:
		return linuxnet.Backend{}, nil
	case vmnethelper.Name:
		return vmnethelper.Backend{}, nil
	}
	return nil, fmt.Errorf("unknown --backend %q (%s)", name, strings.Join(slices.Clone(Names), " or "))
}
