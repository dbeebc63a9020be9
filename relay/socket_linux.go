package relay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// CheckFD checks that fd is an inherited unix datagram socket and makes it
// close-on-exec and non-blocking.
func CheckFD(fd int) error { return checkFD(fd, unix.SOCK_DGRAM) }

// CheckStreamFD is CheckFD for a connected unix stream socket (a VMM's
// connection to a network's stream socket, handed over: Spec.Stream).
func CheckStreamFD(fd int) error { return checkFD(fd, unix.SOCK_STREAM) }

func checkFD(fd, want int) error {
	kind := map[int]string{unix.SOCK_DGRAM: "datagram socket (a socketpair(AF_UNIX, SOCK_DGRAM) end)", unix.SOCK_STREAM: "stream socket (a VMM's connection)"}[want]
	notDgram := fmt.Errorf("--fd %d is not a unix %s", fd, kind)
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err == unix.ENOTSOCK {
		return notDgram
	}
	if err != nil {
		return fmt.Errorf("--fd %d: %w", fd, err)
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("--fd %d: %w", fd, err)
	}
	if typ != want || domain != unix.AF_UNIX {
		return notDgram
	}
	unix.CloseOnExec(fd)
	return unix.SetNonblock(fd, true)
}

// Listener is the --socket PATH socket and its lock, and the path of the
// client it serves once one came.
type Listener struct {
	fd         int
	path, lock string
	client     string // the served client's socket path, once one came
	lockFile   *os.File
}

// Listen creates the unix datagram socket at path (mode 0600, owned by the
// user the helper runs as) after taking path.lock, so two helpers never
// serve one path; a stale socket left by a crashed helper is replaced.
func Listen(path string) (*Listener, error) { return listen(path, unix.SOCK_DGRAM, false) }

// ListenStream is Listen for a stream socket (Spec.Stream), listening for
// one VMM at a time.
func ListenStream(path string) (*Listener, error) { return listenStream(path, false) }

// ListenShared is Listen, or ListenStream with stream, for a process whose
// umask its other goroutines rely on (helper.Prepare, in the controller):
// it leaves the umask alone and makes the socket 0600 once bound (before
// that, as bind made it under the usual umask, only its owner may write to
// it, which connecting needs).
func ListenShared(path string, stream bool) (*Listener, error) {
	if stream {
		return listenStream(path, true)
	}
	return listen(path, unix.SOCK_DGRAM, true)
}

func listenStream(path string, shared bool) (*Listener, error) {
	l, err := listen(path, unix.SOCK_STREAM, shared)
	if err != nil {
		return nil, err
	}
	if err := unix.Listen(l.fd, 1); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	return l, nil
}

func listen(path string, typ int, shared bool) (*Listener, error) {
	l := &Listener{fd: -1, path: path, lock: helperproto.SocketLock(path)}
	f, err := os.OpenFile(l.lock, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("--socket %s is in use by another helper (%s is locked)", path, l.lock)
		}
		return nil, fmt.Errorf("locking %s: %w", l.lock, err)
	}
	l.lockFile = f
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		l.Close()
		return nil, fmt.Errorf("removing stale socket: %w", err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("creating socket: %w", err)
	}
	l.fd = fd
	if shared {
		err = unix.Bind(fd, &unix.SockaddrUnix{Name: path})
		if err == nil {
			err = unix.Fchmodat(unix.AT_FDCWD, path, 0o600, 0)
		}
	} else {
		old := unix.Umask(0o177) // bind creates the path 0600, with no window
		err = unix.Bind(fd, &unix.SockaddrUnix{Name: path})
		unix.Umask(old)
	}
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	return l, nil
}

// Release closes this process's descriptors of the socket and its lock
// and leaves both in place, for the process that inherited them (the
// relay that helper.Prepare started).
func (l *Listener) Release() {
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
	if l.lockFile != nil {
		l.lockFile.Close()
		l.lockFile = nil
	}
}

// Close removes the socket and its lock. A nil Listener (--fd) has none.
func (l *Listener) Close() {
	if l == nil {
		return
	}
	if l.fd >= 0 {
		unix.Close(l.fd)
		os.Remove(l.path)
		l.fd = -1
	}
	if l.lockFile != nil {
		os.Remove(l.lock)
		l.lockFile.Close()
		l.lockFile = nil
	}
}

// unboundLogEvery is how often accept logs, at most, the datagrams it
// ignores.
const unboundLogEvery = 10 * time.Second

// accept waits for the first datagram, learns the client's address from it
// and connects to it: from then on the kernel delivers only that client's
// datagrams and refuses other senders. It returns the first frame.
func (l *Listener) accept(stop int, buf []byte, log *Logger) ([]byte, string, error) {
	w := newWaiter(l.fd, stop)
	// Any local process may send these, as fast as it likes.
	unbound := &Limited{every: unboundLogEvery}
	refused := &Limited{every: unboundLogEvery}
	for {
		n, from, err := unix.Recvfrom(l.fd, buf, 0)
		switch {
		case err == unix.EAGAIN:
			if err := w.wait(unix.POLLIN, -1); err != nil {
				return nil, "", err
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, "", fmt.Errorf("waiting for a client: %w", err)
		}
		sa, ok := from.(*unix.SockaddrUnix)
		if !ok || sa.Name == "" {
			log.WarnLimited(unbound, "main", "ignoring a datagram from an unbound client: a client must bind its own socket path")
			continue
		}
		if err := unix.Connect(l.fd, sa); err != nil {
			log.WarnLimited(refused, "main", "cannot connect to client %q: %v", sa.Name, err)
			continue
		}
		if n < minFirstDatagram {
			log.Debugf("main", "dropping a %d byte hello from %q", n, sa.Name)
			return nil, sa.Name, nil
		}
		return buf[:n], sa.Name, nil
	}
}

// FD is the listener's socket.
func (l *Listener) FD() int { return l.fd }

// LockFD is the descriptor of the listener's lock file.
func (l *Listener) LockFD() int { return int(l.lockFile.Fd()) }
