package helper

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
)

// checkSudo keeps a helper run as root through sudo to what the user who
// ran sudo may do. A sudoers rule lets users run the helper as root (as
// vmnet-helper's does); the helper then acts for that user only: it drops to
// their ids and no others (--uid 0 would keep root for the socket, whose
// path the user names, so root would remove and create files anywhere), and
// it reads only a networks.yaml that they could read themselves (its
// contents may come back in error messages), it serves --socket only at a
// path they could create (checkSocketPath), and it keeps the guard on the
// port (--no-spoof-check would let the VM spoof other users' VMs).
func (f *Flags) checkSudo() error {
	if !throughSudo() {
		return nil
	}
	sudoUID := helperproto.SudoID("SUDO_UID")
	sudoGID := helperproto.SudoID("SUDO_GID")
	if sudoGID < 0 {
		return fmt.Errorf("SUDO_UID is %d but SUDO_GID %q is not a group id", sudoUID, os.Getenv("SUDO_GID"))
	}
	if f.NoSpoofCheck {
		return fmt.Errorf("--no-spoof-check: run through sudo, the helper guards its port: the guard keeps the VM from taking the addresses and traffic of other users' VMs")
	}
	if f.UID != sudoUID {
		return fmt.Errorf("--uid %d: run through sudo, the helper runs as the user who ran sudo (uid %d), no one else", f.UID, sudoUID)
	}
	if f.GID >= 0 && f.GID != sudoGID && !memberOf(sudoUID, f.GID) {
		return fmt.Errorf("--gid %d: run through sudo, the helper runs with a group of the user who ran sudo (uid %d)", f.GID, sudoUID)
	}
	path := f.NetworksFile
	if path == "" {
		path = os.Getenv(config.EnvNetworks)
	}
	if path != "" && !readableBy(path, sudoUID, sudoGID) {
		return fmt.Errorf("--networks %s: the user who ran sudo (uid %d) cannot read it, so the helper will not either", path, sudoUID)
	}
	if f.Socket != "" {
		return checkSocketPath(f.Socket, sudoUID, sudoGID)
	}
	return nil
}

// throughSudo reports whether the helper runs as root for a user through
// sudo (the controller starts its helpers without sudo's variables).
func throughSudo() bool { return os.Getuid() == 0 && helperproto.SudoID("SUDO_UID") > 0 }

// checkSocketPath refuses a --socket path that user uid (primary group
// gid) could not create themselves: the helper replaces a stale socket
// there and creates path.lock beside it. The directory must let them
// create files (write and search), and the path and its lock, if they
// exist, must be theirs, the path a socket: never another user's file,
// which the helper would remove.
func checkSocketPath(path string, uid, gid int) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--socket %s: %w", path, err)
	}
	if !permits(fi, uid, gid, 0o3) { // write and search
		return fmt.Errorf("--socket %s: the user who ran sudo (uid %d) cannot create files in %s, so the helper will not either", path, uid, dir)
	}
	for _, p := range []string{path, relay.SocketLock(path)} {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("--socket %s: %w", path, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok || int(st.Uid) != uid:
			return fmt.Errorf("--socket %s: %s exists and does not belong to the user who ran sudo (uid %d); refusing to replace it", path, p, uid)
		case p == path && fi.Mode()&fs.ModeSocket == 0:
			return fmt.Errorf("--socket %s exists and is not a socket; refusing to replace it", path)
		case p != path && !fi.Mode().IsRegular():
			return fmt.Errorf("--socket %s: %s exists and is not a regular file; refusing it", path, p)
		}
	}
	return nil
}

// readableBy tells whether the file at path (after symbolic links) grants
// read permission to uid with primary group gid, by its owner and mode.
func readableBy(path string, uid, gid int) bool {
	fi, err := os.Stat(path)
	return err == nil && permits(fi, uid, gid, 0o4)
}

// permits tells whether fi's owner and mode grant uid, with primary group
// gid, every permission of perm (rwx bits: 4 read, 2 write, 1 search).
func permits(fi os.FileInfo, uid, gid int, perm os.FileMode) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	mode := fi.Mode().Perm()
	switch {
	case int(st.Uid) == uid:
		return mode>>6&perm == perm
	case int(st.Gid) == gid || memberOf(uid, int(st.Gid)):
		return mode>>3&perm == perm
	}
	return mode&perm == perm
}

// memberOf tells whether user uid belongs to group gid.
func memberOf(uid, gid int) bool {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	return err == nil && slices.Contains(ids, strconv.Itoa(gid))
}
