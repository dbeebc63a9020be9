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

// aliasPrefix starts every interface alias (ifalias) vmnetctl sets.
const aliasPrefix = "vmnetctl:"

// markPrefix starts the interface alias (ifalias) and nftables table comment
// that mark a kernel object as vmnetctl's. Only objects that carry the mark
// of a network are ever changed or deleted, and only for that network.
const markPrefix = aliasPrefix + "network="

// tablePrefix starts the name of each network's nftables table.
const tablePrefix = "vmnetctl-"

// Mark is the ifalias and table comment of the objects of network id.
func Mark(id string) string { return markPrefix + id }

// tapMarkPrefix marks a VM's TAP, made by CreatePort: "vmnetctl:tap=NAME".
const tapMarkPrefix = aliasPrefix + "tap="

// TapMark is the ifalias CreatePort gives the TAP named name, so that a TAP
// left behind by a helper killed with its cleanup child is known as ours.
func TapMark(name string) string { return tapMarkPrefix + name }

// TableName is the nftables table (family inet) of network id.
func TableName(id string) string { return tablePrefix + id }

// LeaseFile is where the DHCP leases of network id are kept under stateDir.
func LeaseFile(stateDir, id string) string {
	return filepath.Join(stateDir, id+".leases.json")
}
