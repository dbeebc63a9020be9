package netplane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/vmnetctl/vmnetctl/statedir"
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

// EnvOwner names, in the environment of the processes a state dir's
// controller or `vmnetctl run` starts (its helpers, and through them their
// cleanup children), that state dir: a process that did not call SetOwner
// takes its owner from it, so that the VM ports a helper makes carry the
// mark of the state dir that started it.
const EnvOwner = "VMNETCTL_OWNER"

// OwnerEnv is the environment entry that gives a child process the owner
// of stateDir (EnvOwner).
func OwnerEnv(stateDir string) string { return EnvOwner + "=" + stateDir }

// SetOwner makes the process's marks carry the identity of stateDir: the
// objects one state dir makes are then told from another's on the same
// host. The controller of a state dir sets it; "" is no owner.
func SetOwner(stateDir string) {
	tag := ownerTag(stateDir)
	owner.Store(&tag)
	setOwnerDir(stateDir)
}

// ownerDir is the state dir SetOwner was given: where the FRR files and
// this host's WireGuard key are.
var ownerDir atomic.Pointer[string]

func setOwnerDir(stateDir string) { ownerDir.Store(&stateDir) }

// OwnerDir is the state dir SetOwner was given; "" without one.
func OwnerDir() string {
	if p := ownerDir.Load(); p != nil {
		return *p
	}
	return ""
}

// ownerTag is the owner of stateDir's objects: 8 hex digits of SHA-256 of
// its canonical path (one for every spelling of the directory); "" for "".
func ownerTag(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(statedir.Canonical(stateDir)))
	return hex.EncodeToString(sum[:4])
}

// envOwner is the owner of $VMNETCTL_OWNER (EnvOwner), read once.
var envOwner = sync.OnceValue(func() string { return ownerTag(os.Getenv(EnvOwner)) })

// Owner is the process's owner tag: SetOwner's, else that of the state dir
// its environment names (EnvOwner), else "".
func Owner() string {
	if p := owner.Load(); p != nil {
		return *p
	}
	return envOwner()
}

// tapMarkPrefix marks a VM's TAP, made by CreatePort:
// "vmnetctl:tap=NAME@OWNER", or "vmnetctl:tap=NAME" without an owner (as
// before owners were marked).
const tapMarkPrefix = aliasPrefix + "tap="

// TapMark is the ifalias CreatePort gives the TAP named name, so that a TAP
// left behind by a helper killed with its cleanup child is known as ours,
// and as which state dir's.
func TapMark(name string) string {
	if o := Owner(); o != "" {
		return tapMarkPrefix + name + ownerSep + o
	}
	return tapMarkPrefix + name
}

// TableName is the nftables table (family inet) of network id.
func TableName(id string) string { return tablePrefix + id }

// FRRConfigFile is where stateDir keeps the FRR configuration vmnetctl
// wrote for network id's EVPN segment (netplane/evpn_linux.go).
func FRRConfigFile(stateDir, id string) string {
	return filepath.Join(stateDir, "frr", id+".conf")
}

// LeaseFile is where the DHCP leases of network id are kept under stateDir.
func LeaseFile(stateDir, id string) string {
	return filepath.Join(stateDir, id+".leases.json")
}
