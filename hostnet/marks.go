package hostnet

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// AliasPrefix starts every interface alias (ifalias) vmnetctl sets.
const AliasPrefix = "vmnetctl:"

// MarkPrefix starts the interface alias (ifalias) and nftables table comment
// that mark a kernel object as vmnetctl's. Only objects that carry the mark
// of a network are ever changed or deleted, and only for that network.
const MarkPrefix = AliasPrefix + "network="

// Mark is the ifalias and table comment of the objects of network id:
// "vmnetctl:network=ID@OWNER", where OWNER (SetOwner) tells the state dirs
// of one host apart. Without an owner (a helper, a test) it is
// "vmnetctl:network=ID", as before owners were marked.
func Mark(id string) string {
	if o := Owner(); o != "" {
		return MarkPrefix + id + OwnerSep + o
	}
	return MarkPrefix + id
}

// OwnerSep separates a mark's network id (which cannot hold it) from its owner.
const OwnerSep = "@"

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
	tag := OwnerTag(stateDir)
	owner.Store(&tag)
	SetOwnerDir(stateDir)
}

// ownerDir is the state dir SetOwner was given: where the FRR files and
// this host's WireGuard key are.
var ownerDir atomic.Pointer[string]

// SetOwnerDir sets the state dir alone, keeping the owner tag: tests
// that play several hosts in one process.
func SetOwnerDir(stateDir string) { ownerDir.Store(&stateDir) }

// OwnerDir is the state dir SetOwner was given; "" without one.
func OwnerDir() string {
	if p := ownerDir.Load(); p != nil {
		return *p
	}
	return ""
}

// OwnerTag is the owner of stateDir's objects: 8 hex digits of SHA-256 of
// its canonical path (one for every spelling of the directory); "" for "".
func OwnerTag(stateDir string) string {
	if stateDir == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(statedir.Canonical(stateDir)))
	return hex.EncodeToString(sum[:4])
}

// envOwner is the owner of $VMNETCTL_OWNER (EnvOwner), read once.
var envOwner = sync.OnceValue(func() string { return OwnerTag(os.Getenv(EnvOwner)) })

// Owner is the process's owner tag: SetOwner's, else that of the state dir
// its environment names (EnvOwner), else "".
func Owner() string {
	if p := owner.Load(); p != nil {
		return *p
	}
	return envOwner()
}

// TapMarkPrefix marks a VM's TAP, made by CreatePort:
// "vmnetctl:tap=NAME@OWNER", or "vmnetctl:tap=NAME" without an owner (as
// before owners were marked).
const TapMarkPrefix = AliasPrefix + "tap="

// TapMark is the ifalias CreatePort gives the TAP named name, so that a TAP
// left behind by a helper killed with its cleanup child is known as Ours,
// and as which state dir's.
func TapMark(name string) string {
	if o := Owner(); o != "" {
		return TapMarkPrefix + name + OwnerSep + o
	}
	return TapMarkPrefix + name
}

// ShaperMarkPrefix marks the IFB device that shapes what a VM sends
// (package shaper): "vmnetctl:shaper=PORT@OWNER".
const ShaperMarkPrefix = AliasPrefix + "shaper="

// ShaperMark is the ifalias of the IFB device of port.
func ShaperMark(port string) string {
	if o := Owner(); o != "" {
		return ShaperMarkPrefix + port + OwnerSep + o
	}
	return ShaperMarkPrefix + port
}

// MarkOwner is the owner tag of a mark, or "" for a mark without one.
func MarkOwner(mark string) string {
	_, o, _ := strings.Cut(strings.TrimPrefix(mark, MarkPrefix), OwnerSep)
	return o
}

// Ours tells whether a mark of some network is this process's to change:
// its owner's, or a mark without an owner (made before owners were marked,
// or by a helper or test run without a state dir), which is adopted. A
// process without an owner takes every mark as its own.
func Ours(mark string) bool {
	o := MarkOwner(mark)
	return o == "" || Owner() == "" || o == Owner()
}

// Mine tells whether a mark is this process's by its owner alone: a mark
// with its owner, or, for a process without an owner, any mark. Unlike
// Ours, a mark without an owner is not Mine for a process with one: it may
// be another state dir's, from before owners were marked.
func Mine(mark string) bool { return Owner() == "" || MarkOwner(mark) == Owner() }

// MarkedID returns the network id a mark names, whoever its owner, and
// whether s is a mark.
func MarkedID(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, MarkPrefix)
	id, _, _ := strings.Cut(rest, OwnerSep)
	return id, ok && id != ""
}
