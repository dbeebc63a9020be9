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
	"github.com/vmnetctl/vmnetctl/statedir"
)

// checkSudo keeps a helper run as root through sudo to what the user who
// ran sudo may do. A sudoers rule lets users run the helper as root (as
// vmnet-helper's does); the helper then acts for that user only: it drops to
// their ids and no others (--uid 0 would keep root for the socket, whose
// path the user names, so root would remove and create files anywhere), and
// it reads only a networks.yaml that they could read themselves (its
// contents may come back in error messages), it serves --socket only at a
// path they could create (checkSocketPath), it takes neither of the
// controller's files (--stats-file, --shaping-file), and it keeps the guard
// on the port (--no-spoof-check would let the VM spoof other users' VMs).
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
	if path != "" {
		if err := checkSudoNetworks(path, sudoUID, sudoGID); err != nil {
			return err
		}
	}
	if f.StateDir != "" && filepath.Clean(f.StateDir) != filepath.Clean(statedir.Default()) {
		// A state dir of the user's choosing would have root write the
		// networks of record, locks and runtime files into any directory
		// root owns (/etc/vmnetctl, say) and start a controller on it.
		return fmt.Errorf("--state-dir %s: run through sudo, the helper uses the default state dir %s only", f.StateDir, statedir.Default())
	}
	// The controller's files: it runs its helpers as root without sudo.
	// Through sudo, root would create, truncate or read a file the user
	// names (/etc/passwd), as the user may not.
	for _, o := range []struct{ flag, path string }{{"--stats-file", f.StatsFile}, {"--shaping-file", f.ShapingFile}} {
		if o.path != "" {
			return fmt.Errorf("%s %s: run through sudo, the helper takes no %s: it is the controller's, which runs its helpers without sudo", o.flag, o.path, o.flag)
		}
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
	for _, p := range []string{path, helperproto.SocketLock(path)} {
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

// checkSudoNetworks refuses, through sudo, a networks.yaml that is not
// root's as lima requires of its own: the file and every directory above it
// owned by root and writable by no one else (a sticky directory such as
// /tmp may be: no one else may replace root's entries in it), so the user
// can neither choose the networks (a bridge onto any interface of the
// host, tunnels, a group for the controller's API) nor swap the file after
// this check. The user must also be able to read it, through every
// directory above it: its contents may come back in error messages.
func checkSudoNetworks(path string, uid, gid int) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("--networks %s: %w", path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("--networks %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() || !rootsAlone(fi) {
		return fmt.Errorf("--networks %s: run through sudo, the helper reads only a networks.yaml that is root's and that no one else may write (as lima requires of its networks.yaml)", path)
	}
	if !permits(fi, uid, gid, 0o4) {
		return fmt.Errorf("--networks %s: the user who ran sudo (uid %d) cannot read it, so the helper will not either", path, uid)
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		di, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("--networks %s: %w", path, err)
		}
		if st, ok := di.Sys().(*syscall.Stat_t); !rootsAlone(di) && !(ok && st.Uid == 0 && di.Mode()&os.ModeSticky != 0) {
			return fmt.Errorf("--networks %s: run through sudo, the helper reads only a networks.yaml in directories that are root's and that no one else may write (%s is not)", path, dir)
		}
		if !permits(di, uid, gid, 0o1) {
			return fmt.Errorf("--networks %s: the user who ran sudo (uid %d) cannot reach it (%s), so the helper will not either", path, uid, dir)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// rootsAlone tells whether fi is root's and no one else may write it.
func rootsAlone(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0 && fi.Mode().Perm()&0o022 == 0
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
