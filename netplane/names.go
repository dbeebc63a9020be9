package netplane

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
)

// ErrUnsupported is returned by the data plane on systems other than Linux,
// where vmnet (through vmnet-helper) is the data plane instead.
var ErrUnsupported = fmt.Errorf("the vmnetctl data plane runs on Linux, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// LeaseFile is where the DHCP leases of network id are kept under stateDir.
func LeaseFile(stateDir, id string) string {
	return filepath.Join(stateDir, id+".leases.json")
}
