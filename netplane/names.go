package netplane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
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

// Mark is the ifalias and table comment of the objects of network id:
// "vmnetctl:network=ID@OWNER", where OWNER (SetOwner) tells the state dirs
// of one host apart. Without an owner (a helper, a test) it is
// "vmnetctl:network=ID", as before owners were marked.
func Mark(id string) string {
	if o := Owner(); o != "" {
		return markPrefix + id + ownerSep + o
	}
	return markPrefix + id
}

// ownerSep separates a mark's network id (which cannot hold it) from its owner.
const ownerSep = "@"

var owner atomic.Pointer[string]

// SetOwner makes the process's marks carry the identity of stateDir: the
// objects one state dir makes are then told from another's on the same
// host. The controller of a state dir sets it; "" is no owner.
func SetOwner(stateDir string) {
	tag := ""
	if stateDir != "" {
		if abs, err := filepath.Abs(stateDir); err == nil {
			stateDir = abs
		}
		sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
		tag = hex.EncodeToString(sum[:4])
	}
	owner.Store(&tag)
}

// Owner is the process's owner tag, or "".
func Owner() string {
	if p := owner.Load(); p != nil {
		return *p
	}
	return ""
}

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
