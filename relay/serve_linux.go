package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	gosignal "os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// NewLogger writes vmnet-helper's log lines to w; DEBUG lines only when
// verbose.
func NewLogger(w io.Writer, verbose, stamp bool) *Logger {
	return &Logger{w: w, verbose: verbose, stamp: stamp}
}

// Hooks are what the helper that runs Serve in its own process does
// differently from vmnetctl-relay.
type Hooks struct {
	// Relearn, if set, replaces running Spec.Relearn.
	Relearn func() error
	// Listener, if set, is the --socket listener itself (the helper's
	// own), not one rebuilt from Spec's descriptors.
	Listener *Listener
	// Stats, if set, is where the stats go (the helper's own, which owns
	// the stats file), not one made from Spec.StatsFD.
	Stats *StatsOut
	// Shaping, if set, is the shaping file (the helper's own), not one
	// made from Spec.ShapingFD.
	Shaping *os.File
}

// Serve relays frames as s says until ctx is done or, with --fd, the VM's
// end of the socket goes away; it logs the counters every
// s.StatsInterval, and once more at the end. With --socket it waits for
// the first client, then follows its path across restarts of the VMM. It
// closes and removes the listener when it returns.
func Serve(ctx context.Context, s Spec, log *Logger, h Hooks) error {
	lis := h.Listener
	if lis == nil && s.SocketPath != "" {
		lis = &Listener{fd: s.Socket, path: s.SocketPath, lock: helperproto.SocketLock(s.SocketPath), lockFile: os.NewFile(uintptr(s.LockFD), helperproto.SocketLock(s.SocketPath))}
	}
	defer lis.Close()
	stop, err := stopOnDone(ctx)
	if err != nil {
		return err
	}
	defer stop.close()
	r := &relay{tap: s.TAP, sock: s.Socket, stop: stop.fd, hdr: s.Hdr, tapHdr: s.TapHdr, frame: s.Frame, host: &counters{}, vm: &counters{}, log: log}
	r.stream.conn, r.stream.done = -1, -1
	shaping := h.Shaping
	if shaping == nil && s.ShapingFD > 0 {
		shaping = os.NewFile(uintptr(s.ShapingFD), "shaping") // (in vmnetctl-relay: its own now)
	}
	if shaping != nil {
		defer r.followShapings(shaping)()
	}
	out := h.Stats
	if out == nil {
		// In vmnetctl-relay: the file the helper opened is its own now.
		out = &StatsOut{Log: log}
		if s.StatsFD > 0 {
			out.File = os.NewFile(uintptr(s.StatsFD), "stats")
		}
	}
	defer startStats(r, s.StatsInterval, out)()
	relearn := h.Relearn
	if relearn == nil && len(s.Relearn) > 0 {
		relearn = func() error { return runRelearn(s.Relearn) }
	}
	if s.Stream {
		return serveStream(r, lis, relearn, log)
	}
	return forward(r, lis, s.TapName, relearn, log)
}

// HandedOver is vmnetctl-relay: it serves the Spec a helper handed it in
// EnvSpec (or holds its TAP: Spec.Hold), after printing the helper's
// ready line on stdout. ctx must already catch SIGTERM and SIGINT.
func HandedOver(ctx context.Context, stdout, stderr io.Writer) error {
	v, ok := os.LookupEnv(EnvSpec)
	if !ok {
		return fmt.Errorf("%s is started by `vmnetctl helper`, not by hand", Binary)
	}
	os.Unsetenv(EnvSpec)
	spec, err := DecodeSpec(v)
	if err != nil {
		return err
	}
	log := NewLogger(stderr, spec.Verbose, spec.LogTimestamps)
	log.Debugf("main", "%s relays for TAP %s", Binary, spec.TapName)
	if spec.Ready != "" {
		if _, err := io.WriteString(stdout, spec.Ready+"\n"); err != nil {
			return fmt.Errorf("writing the ready line: %w", err)
		}
	}
	if spec.Hold {
		return Hold(ctx, spec, log, Hooks{})
	}
	err = Serve(ctx, spec, log, Hooks{})
	for _, fd := range spec.Keep {
		unix.Close(fd)
	}
	if spec.CleanupPID > 0 {
		waitChild(spec.CleanupPID)
	}
	return err
}

// followShapings gives the relay its two delay lines and sets them from
// the shaping file (FollowShapings) until the function it returns is
// called.
func (r *relay) followShapings(f *os.File) (stop func()) {
	r.toVM = NewDelayLine(r.sendToVM, func(n uint64) { r.host.drops.Add(n); r.moved() })
	r.fromVM = NewDelayLine(r.writeTap, func(n uint64) { r.vm.drops.Add(n); r.moved() })
	end := FollowShapings(f, r.log, func(s helperproto.Shapings) {
		r.toVM.Set(s.ToVM)
		r.fromVM.Set(s.FromVM)
	})
	return func() {
		end()
		r.toVM.Close()
		r.fromVM.Close()
	}
}

// FollowShapings gives set what the shaping file f says, now and at each
// helperproto.ShapingSignal (the controller's, when it wrote the file
// anew), until the function it returns is called; it logs each change.
// A file that does not read leaves the shaping as it was, with a warning.
func FollowShapings(f *os.File, log *Logger, set func(helperproto.Shapings)) (stop func()) {
	sig := make(chan os.Signal, 1)
	gosignal.Notify(sig, helperproto.ShapingSignal)
	var last helperproto.Shapings
	apply := func() {
		s, err := helperproto.ReadShapings(f)
		if err != nil {
			log.Warnf("main", "the link's shaping stays as it was: %v", err)
			return
		}
		if s != last {
			log.Infof("main", "shaping the link: to the VM %s; from the VM %s", s.ToVM, s.FromVM)
		}
		set(s)
		last = s
	}
	apply() // (after Notify: a change before it is read here)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-sig:
				apply()
			case <-done:
				return
			}
		}
	}()
	return func() {
		gosignal.Stop(sig)
		close(done)
		<-ended
	}
}

// runRelearn runs the command that makes the port's guard forget the MAC
// it learned, and waits for it.
func runRelearn(argv []string) error {
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Files: []*os.File{nil, os.Stderr, os.Stderr}})
	if err != nil {
		return err
	}
	st, err := p.Wait()
	if err != nil {
		return err
	}
	if !st.Success() {
		return fmt.Errorf("%s: %s", filepath.Base(argv[0]), st)
	}
	return nil
}

// stopper is an eventfd that becomes readable when a context is done: the
// relay polls it together with its fds.
type stopper struct {
	fd   int
	done chan struct{} // closed to end the goroutine
	gone chan struct{} // closed when it has ended
}

func stopOnDone(ctx context.Context) (*stopper, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	st := &stopper{fd: fd, done: make(chan struct{}), gone: make(chan struct{})}
	go func() {
		defer close(st.gone)
		select {
		case <-ctx.Done():
			signal(fd)
		case <-st.done:
		}
	}()
	return st, nil
}

// close ends the goroutine, then closes the eventfd it might write.
func (st *stopper) close() {
	close(st.done)
	<-st.gone
	unix.Close(st.fd)
}

// startStats logs the relay's counters every interval; the returned func
// stops that and logs them a last time.
func startStats(r *relay, interval time.Duration, out *StatsOut) (stop func()) {
	logStats := func(host, vm helperproto.Counters) {
		out.Emit(helperproto.Stats{Time: time.Now(), Host: host, VM: vm}, false)
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	if interval > 0 {
		q := &quietStats{wake: make(chan struct{}, 1)}
		r.quiet.Store(q)
		go func() {
			defer close(ended)
			q.run(interval, done, func() (helperproto.Counters, helperproto.Counters) { return r.host.snapshot(), r.vm.snapshot() }, logStats)
		}()
	} else {
		close(ended)
	}
	return func() {
		close(done)
		<-ended
		// A last line, with the final counters, when stats were asked
		// for; none at all otherwise (as vmnet-helper).
		if interval > 0 {
			out.Emit(helperproto.Stats{Time: time.Now(), Host: r.host.snapshot(), VM: r.vm.snapshot()}, true)
		}
	}
}

// heartbeatIntervals is how many stats intervals a helper whose counters
// do not move waits between two lines (helperproto.HeartbeatIntervals).
const heartbeatIntervals = helperproto.HeartbeatIntervals

// quietStats logs the counters every interval while they move, and every
// heartbeatIntervals intervals while they do not: between two, an idle
// helper sleeps, woken by the first frame (moved). Ten thousand idle
// helpers that each woke every 5 s to write an unchanged line cost a
// quarter of a 2-CPU machine.
type quietStats struct {
	asleep atomic.Bool
	wake   chan struct{}
}

// moved wakes q's logger if it sleeps for want of news. The relay calls
// it after each change of its counters: an atomic load while it is awake.
func (q *quietStats) moved() {
	if q.asleep.Load() && q.asleep.CompareAndSwap(true, false) {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

func (q *quietStats) run(interval time.Duration, done <-chan struct{}, snap func() (helperproto.Counters, helperproto.Counters), logStats func(host, vm helperproto.Counters)) {
	var lastHost, lastVM helperproto.Counters
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-done:
			return
		}
		host, vm := snap()
		if host != lastHost || vm != lastVM {
			logStats(host, vm)
			lastHost, lastVM = host, vm
			t.Reset(interval)
			continue
		}
		// Nothing moved: sleep until a frame does.
		if !q.sleep(interval, done, snap, lastHost, lastVM, logStats) {
			return
		}
		t.Reset(interval)
	}
}

// sleep sleeps until a frame moves the counters (it reports true: the
// lines go on every interval from the frame's) or done (false), with a
// heartbeat line every heartbeatIntervals intervals meanwhile once the
// counters ever moved, and no other wake-up: an idle helper wakes once a
// heartbeat, one that never relayed a frame not at all. A change between
// a snapshot and asleep is seen by the second look; one after it wakes
// the logger (moved).
func (q *quietStats) sleep(interval time.Duration, done <-chan struct{}, snap func() (helperproto.Counters, helperproto.Counters), lastHost, lastVM helperproto.Counters, logStats func(host, vm helperproto.Counters)) bool {
	// Nothing to collect while nothing moves: an idle relay allocates
	// next to nothing, and Go's runtime would still collect every two
	// minutes (forcegcperiod), waking a few threads each time: at
	// 10,000 idle helpers, most of what they cost. Collection is back
	// before the first line after a frame.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// A relay whose counters never moved (its VM never came, or sent
	// nothing and was sent nothing) has nothing to beat for: its zeros
	// stand (beatC stays nil). Each beat cost an idle relay some 4 us of
	// CPU a second on this machine: 4% of a CPU at 10,000 relays that
	// wait for their VMs.
	var beat *time.Timer
	var beatC <-chan time.Time
	if lastHost != (helperproto.Counters{}) || lastVM != (helperproto.Counters{}) {
		beat = time.NewTimer(heartbeatIntervals * interval)
		defer beat.Stop()
		beatC = beat.C
	}
	for {
		q.asleep.Store(true)
		if host, vm := snap(); host != lastHost || vm != lastVM {
			q.asleep.Store(false)
			return true
		}
		select {
		case <-q.wake:
			return true
		case <-beatC:
			q.asleep.Store(false)
			logStats(lastHost, lastVM)
			beat.Reset(heartbeatIntervals * interval)
		case <-done:
			return false
		}
	}
}

// forward waits for the client of --socket, then relays frames until
// termination or until the VM's end of the socket goes away.
func forward(r *relay, lis *Listener, tapName string, relearn func() error, log *Logger) error {
	first, err := waitForClient(r, lis, log)
	if errors.Is(err, errStopped) {
		log.Infof("main", "stopped before a client came")
		return nil
	}
	if err != nil {
		return err
	}
	log.Infof("main", "forwarding started")
	useServingProcs()
	if lis != nil {
		r.followPeer = true
		defer followClient(lis, tapName, relearn, log)()
	}
	err = r.run(first)
	switch {
	case errors.Is(err, errPeerGone):
		log.Infof("main", "stopping: %v", err)
		return nil
	case err != nil:
		return err
	}
	log.Infof("main", "stopping: terminated")
	return nil
}

// servingProcs is the Ps a relay runs with once its VM came. Its two
// threads spend their time in syscalls. With no P idle, Go's sysmon takes
// a P from each of them in every syscall it sees last, starts an M for
// it, finds nothing to run and parks it again: context switches, and
// sysmon itself waking every 20 µs. One P more than the two threads can
// hold leaves one idle, and sysmon then lets them be (docs/performance.md:
// 5-13% less CPU per GB).
const servingProcs = 3

// useServingProcs gives the relay servingProcs Ps, when its VM comes: a
// relay started with IdleEnv waits for it on one, which starts fewer
// threads (an `up` of 1,000 VMs: 16% less CPU in the relays).
func useServingProcs() {
	if runtime.GOMAXPROCS(0) < servingProcs {
		runtime.GOMAXPROCS(servingProcs)
	}
}

// followInterval is how often a --socket helper also looks at its
// client's path for a restarted VMM, in case a change notice was missed.
const followInterval = time.Second

// followClient follows the client of --socket across restarts of its VMM.
// A VMM started again binds the same path anew (a new socket), which the
// helper's connected socket does not reach, and whose datagrams the kernel
// refuses while the helper is connected to the old one. So the helper
// watches the path's directory (inotify): when the path goes, it
// disconnects, so that the new VMM's first datagram is taken; when it
// comes back, it connects to the new socket. Every followInterval it also
// compares the path with the socket it serves. The VM's exit is not the
// helper's: it waits, keeping the VM's port, and nothing counts as a crash.
// It returns the function that stops following.
func followClient(lis *Listener, tapName string, relearn func() error, log *Logger) func() {
	path := lis.client
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return func() {}
	}
	// A new socket may get the old one's inode number: its change time
	// tells them apart.
	type id struct {
		dev, ino uint64
		ctime    unix.Timespec
	}
	idOf := func(st *unix.Stat_t) id { return id{st.Dev, st.Ino, st.Ctim} }
	served := idOf(&st)
	var mu sync.Mutex
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if err := unix.Stat(path, &st); err != nil {
			// Gone: take whoever comes next on the path.
			disconnect(lis.fd)
			return
		}
		if idOf(&st) == served {
			return
		}
		if err := unix.Connect(lis.fd, &unix.SockaddrUnix{Name: path}); err != nil {
			return // not bound yet: try again
		}
		served = idOf(&st)
		log.Infof("main", "client %q is a new socket (its VMM restarted): serving it", path)
		if relearn != nil {
			// The new VMM may pick a MAC of its own ("any MAC address
			// works"): the guard forgets the one it learned and keeps
			// the first the new VMM sends from. A helper running as the
			// VM's owner (--uid) may not change nftables: its port
			// keeps the old MAC until it restarts.
			if err := relearn(); err != nil {
				log.Warnf("main", "the port's guard keeps the MAC it learned: %v", err)
			} else {
				log.Infof("main", "port %s learns the new VMM's MAC", tapName)
			}
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	if w, err := watchDir(filepath.Dir(path)); err == nil {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for {
				if _, err := w.Read(buf); err != nil {
					return // closed when following stops
				}
				check()
			}
		})
		wg.Go(func() { <-done; w.Close() })
	}
	wg.Go(func() {
		t := time.NewTicker(followInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				check()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// watchDir returns an inotify descriptor, in Go's poller, that reads an
// event when a name in dir is created, deleted or moved.
func watchDir(dir string) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "inotify"), nil
}

// disconnect ends a datagram socket's association (connect to AF_UNSPEC):
// it takes datagrams from any sender again.
func disconnect(fd int) {
	sa := unix.RawSockaddr{Family: unix.AF_UNSPEC}
	unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
}

// waitForClient waits for the first datagram on --socket and returns it
// when it is a frame for the TAP. With --fd the VM is there already.
func waitForClient(r *relay, lis *Listener, log *Logger) ([]byte, error) {
	if lis == nil {
		return nil, nil
	}
	log.Infof("main", "waiting for client on %q", lis.path)
	first, client, err := lis.accept(r.stop, make([]byte, r.frame), log)
	if err != nil {
		return nil, err
	}
	lis.client = client
	log.Infof("main", "serving client %q", client)
	if len(first) > 0 && len(first) < r.hdr+EthHeaderLen {
		first = nil
	}
	return first, nil
}

// Inheritable clears close-on-exec on the descriptors of s, for the
// process the helper execs into.
func (s Spec) Inheritable() error {
	fds := append([]int{}, s.Keep...)
	if s.CleanupDone > 0 {
		fds = append(fds, s.CleanupDone)
	}
	if !s.Hold {
		fds = append(fds, s.TAP, s.Socket)
	}
	if s.SocketPath != "" {
		fds = append(fds, s.LockFD)
	}
	if s.StatsFD > 0 {
		fds = append(fds, s.StatsFD)
	}
	if s.ShapingFD > 0 {
		fds = append(fds, s.ShapingFD)
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}
