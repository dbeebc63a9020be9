package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/atomicfile"
)

// The files and folders of the state dir, named here and nowhere else.
const (
	networksSnapshotFile = "networks.json"
	networksYAMLFile     = "networks.yaml"
	projectsDir          = "projects"
	runtimeFile          = "runtime.json"
	runDir               = "run"
	controllerLockFile   = "controller.lock"
	opsLockFile          = "ops.lock"
	projectsLockFile     = "projects.lock"
	socketFile           = "controller.sock"
	controllerLogFile    = "controller.log"
	eventsFile           = "events.jsonl"
	helpersDir           = "helpers"
	recordsDir           = "records"
	appliedDir           = "applied"
	vmsDir               = "vms"
	leasesDir            = "leases"
	networksDir          = "networks"
	impairsFile          = "impairs.json"
)

// Dir is one state directory. Each has its own controller, projects and
// networks; two never share anything.
type Dir struct {
	Path string
	// Keep, if set, is KeepDir, worked out once (New).
	Keep string
}

// Init creates the directory and its KeepDir, private to their owner,
// refuses them if someone else could change them (checkTrusted), and
// moves to KeepDir what an earlier vmnetctl kept in the state dir.
func (d Dir) Init() error {
	for _, dir := range []string{d.Path, d.KeepDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
		if err := checkTrusted(dir); err != nil {
			return err
		}
	}
	return d.moveToKeep()
}

// checkTrusted refuses a state dir that anyone but the user running vmnetctl
// could change: a symbolic link, a directory owned by another user, or one
// that its group or others may write. Root keeps projects there that it runs,
// and appends to files there: another user who could plant a file or a
// symbolic link in it could make root run or overwrite what they chose.
func checkTrusted(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	switch st, ok := fi.Sys().(*syscall.Stat_t); {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("state dir %s is a symbolic link; refusing it: give the directory itself", path)
	case !fi.IsDir():
		return fmt.Errorf("state dir %s is not a directory", path)
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("state dir %s belongs to uid %d, not to uid %d who runs vmnetctl; refusing it: another user could change what vmnetctl reads and runs", path, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("state dir %s is writable by its group or others (mode %04o); refusing it: make it private (chmod go-w)", path, fi.Mode().Perm())
	}
	return nil
}

// openNoFollow opens a file of the state dir, never through a symbolic
// link nor blocking on a FIFO (O_NONBLOCK, which regular files ignore), and
// refuses it unless it is trusted (checkTrustedFile).
func openNoFollow(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if err != nil {
		return nil, err
	}
	if err := checkTrustedFile(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkTrustedFile refuses an open file of the state dir, by what fstat
// says of it (not of its path, which could change meanwhile), that is not
// a regular file, belongs to anyone but root or the user running vmnetctl,
// or that its group or others may write: root reads, runs what it reads
// and appends to these files.
func checkTrustedFile(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file (mode %s); refusing it in the state dir", f.Name(), fi.Mode())
	case ok && st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to root or to uid %d who runs vmnetctl; refusing it: another user could change what vmnetctl reads and runs", f.Name(), st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by its group or others (mode %04o); refusing it: make it private (chmod go-w)", f.Name(), fi.Mode().Perm())
	}
	return nil
}

// Exists reports whether the directory exists.
func (d Dir) Exists() bool {
	_, err := os.Stat(d.Path)
	return err == nil
}

// file is the path of a file of the state dir: in KeepDir if it is kept.
func (d Dir) file(elem ...string) string {
	root := d.Path
	if len(elem) > 0 && isKept(elem[0]) {
		root = d.KeepDir()
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

// APISocket is the controller's unix socket.
func (d Dir) APISocket() string { return d.file(socketFile) }

// ControllerLog is the background controller's output.
func (d Dir) ControllerLog() string { return d.file(controllerLogFile) }

// EventsLog is the controller's events, one JSON object per line
// (`vmnetctl events`).
func (d Dir) EventsLog() string { return d.file(eventsFile) }

// NetworksYAML is the recorded networks.yaml, for helpers' --networks.
func (d Dir) NetworksYAML() string { return d.file(networksYAMLFile) }

// LeasesDir holds the DHCP servers' lease files.
func (d Dir) LeasesDir() string { return d.file(leasesDir) }

// HelpersDir holds the helpers' ready lines and logs.
func (d Dir) HelpersDir() string { return d.file(helpersDir) }

// fileKey turns an attachment key ("vm/0") into a file name ("vm.0").
func fileKey(key string) string { return strings.ReplaceAll(key, "/", ".") }

// HelperReadyFile is where the helper of attachment key writes its ready line.
func (d Dir) HelperReadyFile(key string) string { return d.file(helpersDir, fileKey(key)+".json") }

// HelperLogFile is where the helper of attachment key writes its stderr.
func (d Dir) HelperLogFile(key string) string { return d.file(helpersDir, fileKey(key)+".log") }

// HelperStatsFile is where the helper of attachment key keeps its latest
// stats line (`vmnetctl helper --stats-file`).
func (d Dir) HelperStatsFile(key string) string { return d.file(helpersDir, fileKey(key)+".stats") }

// HelperShapingFile is where the controller keeps the shaping of
// attachment key's link, which its helper reads (`vmnetctl helper
// --shaping-file`, helperproto.Shapings).
func (d Dir) HelperShapingFile(key string) string {
	return d.file(helpersDir, fileKey(key)+".shaping")
}

// VMsDir holds one folder per VM, for its sockets.
func (d Dir) VMsDir() string { return d.file(vmsDir) }

// VMDir holds the sockets of one VM; it belongs to the VM's owner.
func (d Dir) VMDir(vm string) string { return d.file(vmsDir, vm) }

// SocketPath is where the helper of an attachment serves the VM.
func (d Dir) SocketPath(vm string, index int) string {
	return d.file(vmsDir, vm, strconv.Itoa(index)+".sock")
}

// NetworkSocketPath is network id's stream socket (api.Network.Socket),
// which any VMM may connect to for a port of its own.
func (d Dir) NetworkSocketPath(id string) string { return d.file(networksDir, id+".sock") }

// ClientSocketPath is where a VMM such as qemu binds its end of the cable.
func (d Dir) ClientSocketPath(vm string, index int) string {
	return d.file(vmsDir, vm, strconv.Itoa(index)+".vm.sock")
}

// Lock is an exclusive flock on a file of the state dir. The kernel drops it
// when the process dies, so a crash never leaves a stale lock behind.
type Lock struct {
	f *os.File
}

// ErrLocked is returned by TryLock when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// LockOps takes the lock that lets one up, down or run at a time change the
// projects, waiting for its holder.
func (d Dir) LockOps() (*Lock, error) { return d.lock(opsLockFile, unix.LOCK_EX) }

// TryLockOps takes the ops lock (LockOps) without waiting: ErrLocked when
// an up, down or run holds it.
func (d Dir) TryLockOps() (*Lock, error) { return d.lock(opsLockFile, unix.LOCK_EX|unix.LOCK_NB) }

// lockProjects takes the lock under which a project is saved with its
// networks.yaml (SaveProjectAndNetworks), a held project dropped
// (DeleteProjectHeldBy), and the runtime files removed for want of
// projects (RemoveRuntimeIfNoProjects), waiting for its holder.
func (d Dir) lockProjects() (*Lock, error) { return d.lock(projectsLockFile, unix.LOCK_EX) }

// TryLockController takes the lock the one controller of the dir holds
// while it runs, without waiting: ErrLocked when a controller runs.
func (d Dir) TryLockController() (*Lock, error) {
	return d.lock(controllerLockFile, unix.LOCK_EX|unix.LOCK_NB)
}

// ControllerAlive reports whether a process holds the controller lock.
func (d Dir) ControllerAlive() bool {
	l, err := d.TryLockController()
	if err != nil {
		return errors.Is(err, ErrLocked)
	}
	l.Unlock()
	return false
}

func (d Dir) lock(name string, how int) (*Lock, error) {
	if err := d.Init(); err != nil {
		return nil, err
	}
	path := d.file(name)
	f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() error { return l.f.Close() }

// writeFile replaces a file of the state dir atomically: readers see the old
// content or the new, never a part, even if the writer crashes.
func (d Dir) writeFile(name string, data []byte) error {
	return d.write(name, data, atomicfile.Options{DirPerm: 0o750})
}

// writeProcessRecord is writeFile of a record of running processes
// (runtime.json, run's helpers, a helper's intent), not synced: a power
// loss ends what it records, and its readers take an unreadable record
// for none (atomicfile.Options.NoSync).
func (d Dir) writeProcessRecord(name string, data []byte) error {
	return d.write(name, data, processRecord)
}

// processRecord is how a record of running processes is placed.
var processRecord = atomicfile.Options{DirPerm: 0o750, NoSync: true}

func (d Dir) write(name string, data []byte, o atomicfile.Options) error {
	path := d.file(name)
	if err := atomicfile.Write(path, data, o); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// writeJSON stores v as indented JSON, atomically.
func (d Dir) writeJSON(name string, v any) error {
	data, err := marshalIndent(name, v)
	if err != nil {
		return err
	}
	return d.writeFile(name, data)
}

// writeProcessJSON is writeJSON of a record of running processes
// (writeProcessRecord).
func (d Dir) writeProcessJSON(name string, v any) error {
	data, err := marshalIndent(name, v)
	if err != nil {
		return err
	}
	return d.writeProcessRecord(name, data)
}

func marshalIndent(name string, v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", name, err)
	}
	return append(data, '\n'), nil
}

// readJSON loads a JSON file of the state dir into v; found is false when
// the file does not exist.
func (d Dir) readJSON(name string, v any) (found bool, err error) {
	data, err := readNoFollow(d.file(name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("reading state %s: %w", d.file(name), err)
	}
	return true, nil
}

// readNoFollow reads a file of the state dir, never through a symbolic link.
func readNoFollow(path string) ([]byte, error) {
	f, err := openNoFollow(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// OpenLog opens a log of the state dir for appending, creating it, never
// through a symbolic link.
func OpenLog(path string) (*os.File, error) {
	return openNoFollow(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
}

// Holds reports whether path names a file inside the state dir: how a
// process that uses the dir (a helper given its socket or networks.yaml) is
// known as this state dir's.
func (d Dir) Holds(path string) bool {
	return strings.HasPrefix(path, filepath.Clean(d.Path)+string(filepath.Separator))
}
