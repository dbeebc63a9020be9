package helperexec

import (
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
)

// Spares keeps relays started ahead of need (helperproto's spare
// relays), a few of each kind of helper started lately: the program,
// credentials and environment of a helper's command. A Start given
// Spares hands its command to a spare of its kind when one waits, which
// takes it in a message instead of a process start; Refill, once the
// starts at hand are done, starts spares for the kinds that were asked
// for. The spares exit when Close or Trim drops them, or when this
// process exits (their socket closes).
type Spares struct {
	per      int
	idle     time.Duration
	stateDir string // the spares' mark (helperproto.SpareArgs)

	mu     sync.Mutex
	kinds  map[string]*spareKind
	closed bool
	fills  sync.WaitGroup // the refills under way
}

// spareKind is the spares of one kind.
type spareKind struct {
	tpl     spareTemplate
	ready   []*spare
	filling int
	used    time.Time // its last Start
	asked   bool      // since the last Refill
	// failed counts the spares that exited before a hand-over, not
	// dropped, and the hand-overs that were not ready, since the last
	// that was: at maxSpareFailures the kind is started no more.
	failed int
}

// maxSpareFailures is how many spares of a kind may exit on their own, one
// after another, before no more are started.
const maxSpareFailures = 3

// spareTemplate is what a spare of a kind is started with.
type spareTemplate struct {
	path string
	cred *syscall.Credential
	env  []string // without the spec
}

// spare is one waiting relay.
type spare struct {
	child *procid.Child
	kind  *spareKind
	ctl   int // this process's end of its socket; -1 once closed

	mu     sync.Mutex
	exited bool
	err    error
	then   func(error) // what its exit calls: the pool's drop, then the helper's
}

// NewSpares keeps per spares of each kind started within the last idle,
// for the controller of state dir stateDir (StraySpares finds them by it).
func NewSpares(per int, idle time.Duration, stateDir string) *Spares {
	return &Spares{per: per, idle: idle, stateDir: stateDir, kinds: map[string]*spareKind{}}
}

// spareKindOf is cmd's kind, what a spare of it is started with and its
// spec; ok false for a command no spare can take: one with a working
// directory, a stdin, system attributes other than credentials and its
// process group, no relay spec, or a command line longer than a spare's.
func spareKindOf(cmd *exec.Cmd, stateDir string) (key string, tpl spareTemplate, spec string, ok bool) {
	if cmd.Dir != "" || cmd.Stdin != nil || cmd.SysProcAttr == nil || !cmd.SysProcAttr.Setpgid ||
		len(cmd.ExtraFiles)+2 > helperproto.MaxHandOverFiles || !helperproto.FitsSpare(cmd.Path, stateDir, cmd.Args) {
		return "", spareTemplate{}, "", false
	}
	for _, f := range append([]any{cmd.Stdout, cmd.Stderr}, anys(cmd.ExtraFiles)...) {
		if f, isFile := f.(*os.File); !isFile || f == nil {
			return "", spareTemplate{}, "", false
		}
	}
	attr := *cmd.SysProcAttr
	attr.Credential, attr.Setpgid = nil, false
	if !reflect.ValueOf(attr).IsZero() {
		return "", spareTemplate{}, "", false
	}
	tpl = spareTemplate{path: cmd.Path, cred: cmd.SysProcAttr.Credential}
	specs := 0
	for _, kv := range cmd.Environ() {
		if v, isSpec := strings.CutPrefix(kv, helperproto.EnvRelaySpec+"="); isSpec {
			spec, specs = v, specs+1
			continue
		}
		tpl.env = append(tpl.env, kv)
	}
	if specs != 1 {
		return "", spareTemplate{}, "", false
	}
	var b strings.Builder
	b.WriteString(tpl.path)
	if c := tpl.cred; c != nil {
		b.WriteString("\x00" + strconv.FormatUint(uint64(c.Uid), 10) + ":" + strconv.FormatUint(uint64(c.Gid), 10) + ":" + strconv.FormatBool(c.NoSetGroups))
		for _, g := range c.Groups {
			b.WriteString("," + strconv.FormatUint(uint64(g), 10))
		}
	}
	for _, kv := range tpl.env {
		b.WriteString("\x00" + kv)
	}
	return b.String(), tpl, spec, true
}

func anys(files []*os.File) []any {
	out := make([]any, len(files))
	for i, f := range files {
		out[i] = f
	}
	return out
}

// take hands cmd to a waiting spare of its kind, and marks the kind
// asked for (Refill); ok false when none took it (start cmd then). onExit
// is the helper's procid.Child.OnExit; done is to be called once the
// start is done, with whether the helper was ready.
func (s *Spares) take(cmd *exec.Cmd) (pid int, onExit func(func(error)), done func(ready bool), ok bool) {
	if s == nil {
		return 0, nil, nil, false
	}
	key, tpl, spec, fits := spareKindOf(cmd, s.stateDir)
	if !fits {
		return 0, nil, nil, false
	}
	msg, err := helperproto.HandOver{Argv: cmd.Args, Spec: spec, Files: 2 + len(cmd.ExtraFiles)}.Encode()
	if err != nil {
		return 0, nil, nil, false
	}
	fds := []int{int(cmd.Stdout.(*os.File).Fd()), int(cmd.Stderr.(*os.File).Fd())}
	for _, f := range cmd.ExtraFiles {
		fds = append(fds, int(f.Fd()))
	}
	for {
		sp := s.pop(key, tpl)
		if sp == nil {
			return 0, nil, nil, false
		}
		if err := unix.Sendmsg(sp.ctl, msg, unix.UnixRights(fds...), nil, unix.MSG_NOSIGNAL); err != nil {
			sp.drop() // gone, or going: it sees the end and exits
			continue
		}
		// The socket stays open until the start is done (done): the
		// spare, once it shows the helper's command line, looks whether
		// it is, and exits if it was closed first (the controller died
		// before it knew the helper started, and the next one, which
		// may have looked for strays already, would not know it).
		return sp.child.Pid, sp.onExit, func(ready bool) { s.handedOver(sp, ready) }, true
	}
}

// pop takes a ready spare of kind key off the pool, marking the kind
// used; nil if none waits.
func (s *Spares) pop(key string, tpl spareTemplate) *spare {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	k := s.kinds[key]
	if k == nil {
		k = &spareKind{tpl: tpl}
		s.kinds[key] = k
	}
	k.used, k.asked = time.Now(), true
	for len(k.ready) > 0 {
		sp := k.ready[0]
		k.ready = k.ready[1:]
		sp.mu.Lock()
		gone := sp.exited
		if !gone {
			sp.then = nil // the pool's no more; the helper's once onExit
		}
		sp.mu.Unlock()
		if !gone {
			return sp
		}
	}
	return nil
}

// Refill starts, in the background, spares of the kinds Start asked for
// since the last Refill, until per of each are ready. Call it once the
// starts at hand are done: a spare's start (a process's, about what a
// helper's cold start costs) then takes no CPU from theirs.
func (s *Spares) Refill() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, k := range s.kinds {
		if k.asked {
			k.asked = false
			s.refill(key, k)
		}
	}
}

// refill starts spares of kind k, one after another in the background,
// until per are ready. Call with s.mu held.
func (s *Spares) refill(key string, k *spareKind) {
	if s.closed || k.filling > 0 || len(k.ready) >= s.per || k.failed >= maxSpareFailures {
		return
	}
	k.filling = 1
	tpl := k.tpl
	s.fills.Add(1)
	go func() {
		defer s.fills.Done()
		for {
			s.mu.Lock()
			if s.closed || len(k.ready) >= s.per || s.kinds[key] != k || k.failed >= maxSpareFailures {
				k.filling = 0
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			sp, err := s.start(k, tpl)
			s.mu.Lock()
			if err != nil || s.closed || s.kinds[key] != k {
				k.filling = 0
				s.mu.Unlock()
				if sp != nil {
					sp.discard(spareGrace) // (Drain waits for this)
				}
				return
			}
			sp.mu.Lock()
			exited := sp.exited
			sp.mu.Unlock()
			if !exited { // (one that exited at once was forgotten already)
				k.ready = append(k.ready, sp)
			}
			s.mu.Unlock()
		}
	}()
}

// start starts a spare of kind k.
func (s *Spares) start(k *spareKind, tpl spareTemplate) (*spare, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	theirs := os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	defer null.Close()
	// /dev/null from 3 up to its socket (helperproto.SpareCtlFD): where a
	// hand-over's descriptors go, held from what its runtime opens.
	var extra []*os.File
	for fd := 3; fd < helperproto.SpareCtlFD; fd++ {
		extra = append(extra, null)
	}
	ignoreShaping()
	cmd := &exec.Cmd{Path: tpl.path, Args: helperproto.SpareArgs(tpl.path, s.stateDir),
		Env:         append(slices.Clone(tpl.env), helperproto.EnvSpare+"="+strconv.Itoa(helperproto.SpareCtlFD)),
		ExtraFiles:  append(extra, theirs),
		SysProcAttr: &syscall.SysProcAttr{Credential: tpl.cred, Setpgid: true}}
	child, err := procid.Start(cmd)
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	sp := &spare{child: child, kind: k, ctl: fds[0]}
	sp.then = func(err error) { s.forget(sp, err) }
	child.OnExit(sp.exit)
	return sp, nil
}

// handedOver ends a spare's hand-over: its socket closed, and its kind's
// count of failures cleared by a helper that was ready, raised by one
// that was not (a spare that takes its hand-over and fails fails every
// attach of its kind: given up after maxSpareFailures).
func (s *Spares) handedOver(sp *spare, ready bool) {
	sp.drop()
	s.mu.Lock()
	if ready {
		sp.kind.failed = 0
	} else {
		sp.kind.failed++
	}
	s.mu.Unlock()
}

// forget takes a spare that exited while it waited off the pool; one
// that failed, its socket not closed by the pool, counts against its kind.
func (s *Spares) forget(sp *spare, err error) {
	sp.mu.Lock()
	dropped := sp.ctl < 0
	sp.mu.Unlock()
	s.mu.Lock()
	k := sp.kind
	k.ready = slices.DeleteFunc(k.ready, func(o *spare) bool { return o == sp })
	if err != nil && !dropped {
		k.failed++
	}
	s.mu.Unlock()
	sp.drop()
}

// exit is the spare's exit, reaped: it calls what then says.
func (sp *spare) exit(err error) {
	sp.mu.Lock()
	sp.exited, sp.err = true, err
	f := sp.then
	sp.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// onExit has f called once the spare, a helper now, has exited.
func (sp *spare) onExit(f func(error)) {
	sp.mu.Lock()
	if sp.exited {
		err := sp.err
		sp.mu.Unlock()
		go f(err)
		return
	}
	sp.then = f
	sp.mu.Unlock()
}

// drop closes a spare's socket, if it still has it: it then exits.
func (sp *spare) drop() {
	sp.mu.Lock()
	fd := sp.ctl
	sp.ctl = -1
	sp.mu.Unlock()
	if fd >= 0 {
		unix.Close(fd)
	}
}

// Trim drops the spares of the kinds not started for idle.
func (s *Spares) Trim() {
	for _, sp := range s.takeKinds(false, func(k *spareKind) bool { return time.Since(k.used) >= s.idle }) {
		sp.drop()
	}
}

// Close drops every spare, and keeps none from now on.
func (s *Spares) Close() {
	for _, sp := range s.takeKinds(true, func(*spareKind) bool { return true }) {
		sp.drop()
	}
}

// Drain drops every waiting spare, as Close does, but keeps starting
// spares from now on, and returns once they are gone, and those being
// started: SIGKILL to any that has not exited within spareGrace (one
// stopped reads no end). The controller drains when no project is left.
func (s *Spares) Drain() {
	var wg sync.WaitGroup
	for _, sp := range s.takeKinds(false, func(*spareKind) bool { return true }) {
		wg.Go(func() { sp.discard(spareGrace) })
	}
	wg.Wait()
	if s != nil {
		s.fills.Wait()
	}
}

// takeKinds takes the kinds that which says off the pool, and returns
// their waiting spares, for the caller to drop; close also keeps the
// pool from starting any more.
func (s *Spares) takeKinds(close bool, which func(*spareKind) bool) []*spare {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = s.closed || close
	var out []*spare
	for key, k := range s.kinds {
		if which(k) {
			out = append(out, k.ready...)
			delete(s.kinds, key)
		}
	}
	return out
}

// spareGrace is how long a dropped spare has to exit, at once on its
// socket's end, before Drain kills it.
const spareGrace = 2 * time.Second

// discard drops a spare that is no pool's now and returns once it has
// exited: SIGKILL after grace.
func (sp *spare) discard(grace time.Duration) {
	gone := make(chan struct{})
	sp.onExit(func(error) { close(gone) })
	sp.drop()
	select {
	case <-gone:
	case <-time.After(grace):
		sp.child.Signal(syscall.SIGKILL)
		<-gone
	}
}
