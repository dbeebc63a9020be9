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

// tablePrefix starts the name of each network's nftables table.
const tablePrefix = "vmnetctl-"

// TableName is the nftables table (family inet) of network id.
func TableName(id string) string { return tablePrefix + id }

// LeaseFile is where the DHCP leases of network id are kept under stateDir.
func LeaseFile(stateDir, id string) string {
	return filepath.Join(stateDir, id+".leases.json")
}
