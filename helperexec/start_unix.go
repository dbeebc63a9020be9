//go:build unix

package helperexec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	gosignal "os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
)

// StartOptions tune Start. Zero values are sensible.
type StartOptions struct {
	// SocketPath, if set (the helper's --socket), must exist before the
	// helper counts as ready.
	SocketPath string
	// StallTimeout is how long the helper may go without progress before
	// it is failed (DefaultStallTimeout): no CPU used by it or its children,
	// nothing of theirs runnable, no log line (stallWatch). A helper that
	// moves, however slowly on a busy machine, is waited for; where
	// progress cannot be read (no /proc), it is a plain timeout.
	StallTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL
	// (default 5s).
	StopGrace time.Duration
	// OnStats receives every stats line, in order, from the helper's
	// stderr reader goroutine.
	OnStats func(helperproto.Stats)
	// Log receives the other stderr lines (with newline), if set.
	Log io.Writer
	// ReadyFile and LogFile, when set, take the helper's stdout (truncated)
	// and stderr (appended) instead of pipes, so that the helper outlives
	// the process that started it: a pipe would break when that process
	// dies. Readiness is then read from ReadyFile; OnStats and Log are not
	// used (read LogFile for stats), and failures quote LogFile's new lines.
	ReadyFile, LogFile string
	// LogFirst, with LogFile, is written to LogFile before the helper's
	// own lines: what its setup in this process logged (helper.Prepare).
	LogFirst []byte
	// Spares, if set, are relays started ahead of need: with ReadyFile,
	// a command one of them can take is handed to it rather than started
	// (Spares.take).
	Spares *Spares
	// AfterExit, if set, is called once: after the helper has exited and
	// before Done is closed, or, if it did not start, before Start
	// returns. It closes what the caller kept of the helper's (its VM's
	// port: backend.PreparedHelper.AfterExit).
	AfterExit func()
	// Started, if set, is called once the helper process runs (or a spare
	// took its command), before its readiness is waited for: the caller
	// closes its copies of the helper's descriptors (helper.Prepared's
	// Release), which a helper stopped before it is ready may wait for
	// (a held TAP's cleanup child exits only once no one holds its pipe).
	Started func()
}

// Helper is a running helper process.
type Helper struct {
	// Ready is the helper's JSON line.
	Ready helperproto.Ready

	cmd      *exec.Cmd // until started
	pid      int
	grace    time.Duration
	logFile  string // file mode: the helper's stderr
	logStart int64
	tail     *tail
	reaped   chan struct{} // closed once it has exited, before afterExit
	done     chan struct{} // closed after afterExit
	err      error         // from Wait, valid after done
	once     sync.Once

	afterExit func()           // StartOptions.AfterExit
	spareDone func(ready bool) // a spare's hand-over, to end once Start is done

	// onExit is what OnExit was given, run once done is closed.
	exitMu sync.Mutex
	onExit []func()
}

// ignoreShapingSignal makes this process ignore the shaping signal, once.
var ignoreShapingSignal sync.Once

// ignoreShaping has this process ignore the shaping signal before it
// starts its first helper: the helper starts with it ignored (a child
// keeps SIG_IGN across its exec), so that one the controller sends before
// the helper listens for it cannot end it (helperproto.ShapingSignal).
func ignoreShaping() {
	ignoreShapingSignal.Do(func() { gosignal.Ignore(helperproto.ShapingSignal) })
}

// tailLines is how much of stderr a start failure quotes.
const tailLines = 20

// Start runs cmd (a helper: vmnet-helper or `vmnetctl helper`) in its own
// process group and waits until it is ready: its JSON line parsed and, with
// opts.SocketPath, the socket there. On failure — the helper exits, prints
// an invalid line, ctx is done or the deadline passes — the helper is
// killed and the error quotes the tail of its stderr. cmd's Stdout and
// Stderr must be unset: Start reads them. After Start, ctx no longer
// matters: call Stop.
func Start(ctx context.Context, cmd *exec.Cmd, opts StartOptions) (*Helper, error) {
	notStarted := func(err error) (*Helper, error) {
		// exit never runs.
		if opts.AfterExit != nil {
			opts.AfterExit()
		}
		return nil, err
	}
	if cmd.Stdout != nil || cmd.Stderr != nil {
		return notStarted(errors.New("helperexec.Start reads the helper's stdout and stderr: leave them unset"))
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 5 * time.Second
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	ignoreShaping()
	h := &Helper{cmd: cmd, grace: opts.StopGrace, tail: &tail{max: tailLines}, reaped: make(chan struct{}), done: make(chan struct{}), afterExit: opts.AfterExit}
	var lines <-chan []byte
	var err error
	if opts.ReadyFile != "" {
		lines, err = h.startWithFiles(opts)
	} else {
		lines, err = h.startWithPipes(opts)
	}
	if err != nil {
		return notStarted(err)
	}
	if opts.Started != nil {
		opts.Started()
	}
	ready := false // (what a spare's hand-over is told at the end)
	if h.spareDone != nil {
		defer func() { h.spareDone(ready) }()
	}

	// Read by the start only: a supervisor of thousands keeps none.
	cmd.Env, cmd.Args, h.cmd = nil, nil, nil
	fail := func(format string, args ...any) (*Helper, error) {
		select {
		case <-h.done: // reaped: its pid may already be someone else's
		default:
			h.kill()
			<-h.done
		}
		h.readLogTail()
		msg := fmt.Sprintf(format, args...)
		if t := h.tail.String(); t != "" {
			msg += ":\n" + t
		}
		return nil, errors.New(msg)
	}
	watch := newStallWatch(h.Pid(), opts.StallTimeout, h.logSize)
	check := time.NewTicker(stallCheck(opts.StallTimeout))
	defer check.Stop()
	for waiting := true; waiting; {
		select {
		case line, ok := <-lines:
			if !ok {
				<-h.done
				h.readLogTail()
				return fail("helper exited before it was ready (%v)", h.err)
			}
			r, err := helperproto.ParseReady(bytes.TrimSpace(line))
			if err != nil {
				return fail("%v", err)
			}
			h.Ready, waiting = r, false
		case now := <-check.C:
			if err := watch.check(now); err != nil {
				return fail("%v", err)
			}
		case <-ctx.Done():
			return fail("starting helper: %v", ctx.Err())
		}
	}
	if opts.SocketPath != "" {
		var look startPoll
		for {
			if _, err := os.Stat(opts.SocketPath); err == nil {
				break
			}
			select {
			case <-look.next():
			case <-h.done:
				return fail("helper exited before creating %s (%v)", opts.SocketPath, h.err)
			case now := <-check.C:
				if err := watch.check(now); err != nil {
					return fail("helper did not create %s: %v", opts.SocketPath, err)
				}
			case <-ctx.Done():
				return fail("starting helper: %v", ctx.Err())
			}
		}
	}
	ready = true
	return h, nil
}

// stallCheck is how often Start looks at a starting helper's progress: a
// tenth of the stall window, at most every half second.
func stallCheck(stall time.Duration) time.Duration { return min(stall/10, 500*time.Millisecond) }

// logSize is how much the helper has logged: its log file's size in file
// mode, the lines its stderr reader took with pipes.
func (h *Helper) logSize() int64 {
	if h.logFile == "" {
		return int64(h.tail.count())
	}
	fi, err := os.Stat(h.logFile)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// startWithPipes starts cmd reading its stdout and stderr through pipes.
func (h *Helper) startWithPipes(opts StartOptions) (<-chan []byte, error) {
	cmd := h.cmd
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting helper: %w", err)
	}
	h.pid = cmd.Process.Pid
	lines := make(chan []byte, 1)
	var readers sync.WaitGroup
	readers.Go(func() {
		r := bufio.NewReader(stdout)
		line, err := r.ReadBytes('\n')
		if err == nil || len(line) > 0 {
			lines <- line
		}
		close(lines)
		io.Copy(io.Discard, r) // a helper prints one line; never block it
	})
	readers.Go(func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if s, ok := helperproto.ParseStatsLine(line); ok {
				if opts.OnStats != nil {
					opts.OnStats(s)
				}
				continue
			}
			h.tail.add(line)
			if opts.Log != nil {
				io.WriteString(opts.Log, line+"\n")
			}
		}
	})
	go func() {
		// Wait only after the pipes are drained, as exec.Cmd requires.
		readers.Wait()
		procid.WaitGone(cmd.Process.Pid)
		h.err = cmd.Wait()
		h.exit()
	}()
	return lines, nil
}

// startWithFiles starts cmd with its stdout and stderr on files, and
// watches the ready file for the JSON line.
func (h *Helper) startWithFiles(opts StartOptions) (<-chan []byte, error) {
	cmd := h.cmd
	ready, err := os.OpenFile(opts.ReadyFile, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o640)
	if err != nil {
		return nil, err
	}
	defer ready.Close()
	logf, err := os.OpenFile(opts.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o640)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	h.logFile = opts.LogFile
	h.logStart, _ = logf.Seek(0, io.SeekEnd)
	if _, err := logf.Write(opts.LogFirst); err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = ready, logf
	pid, onExit, done, spared := opts.Spares.take(cmd)
	if spared {
		h.spareDone = done
	} else {
		child, err := procid.Start(cmd) // one pidfd, waited on in the poller
		if err != nil {
			return nil, fmt.Errorf("starting helper: %w", err)
		}
		pid, onExit = child.Pid, child.OnExit
	}
	h.pid = pid
	onExit(func(err error) { // no goroutine waits for each helper
		h.err = err
		h.exit()
	})
	lines := make(chan []byte, 1)
	// Watched before the file is first read: a write after that read
	// wakes the wait.
	watch := newFileWait(opts.ReadyFile)
	looked := make(chan struct{})
	if watch != nil {
		// The file's close as the helper exits wakes the wait before
		// the exit is known (done): the exit wakes it again. (Not
		// through OnExit: a running helper would keep the watch.)
		go func() {
			select {
			case <-h.done:
				watch.wake()
			case <-looked:
			}
		}()
	}
	go func() {
		defer close(lines)
		defer close(looked)
		defer watch.close()
		var look startPoll
		for {
			data, _ := os.ReadFile(opts.ReadyFile)
			if i := bytes.IndexByte(data, '\n'); i >= 0 {
				lines <- data[:i+1]
				return
			}
			if watch != nil {
				// Woken by the line's write, or by the file's close
				// when the helper exits; the bound only looks at done
				// now and then.
				watch.wait(watchedLook)
				select {
				case <-h.done:
					return
				default:
				}
				continue
			}
			select {
			case <-h.done:
				return
			case <-look.next():
			}
		}
	}()
	return lines, nil
}

// watchedLook bounds a wait for the ready line that a watch of its file
// wakes.
const watchedLook = 100 * time.Millisecond

// startPoll paces the looks at a file that a starting helper makes:
// every 2 ms for its first 50 ms, every 10 ms after that. A helper is
// ready about 10 ms after its start on an idle machine, which a fixed
// 10 ms tick saw up to 10 ms late (a doubling backoff, 1, 2, 4, 8 ms,
// up to 5 ms late: measured, side by side); one that takes its time on a
// busy machine is looked at 100 times a second.
type startPoll struct{ n int }

func (p *startPoll) next() <-chan time.Time {
	p.n++
	if p.n <= 25 {
		return time.After(2 * time.Millisecond)
	}
	return time.After(10 * time.Millisecond)
}

// readLogTail fills the tail from the log file, in file mode.
func (h *Helper) readLogTail() {
	if h.logFile == "" {
		return
	}
	f, err := os.Open(h.logFile)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(h.logStart, io.SeekStart); err != nil {
		return
	}
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		if _, isStats := helperproto.ParseStatsLine(sc.Text()); !isStats {
			h.tail.add(sc.Text())
		}
	}
}

// exit marks the helper gone: reaped closed; then AfterExit run, done
// closed and what OnExit was given run, on the goroutine that reaped it,
// or, with an AfterExit (which waits for the kernel a moment), on a
// goroutine of its own: the reaper may be the poller of every helper.
func (h *Helper) exit() {
	close(h.reaped)
	if h.afterExit == nil {
		h.finish()
		return
	}
	go func() {
		h.afterExit()
		h.finish()
	}()
}

// finish closes done and runs what OnExit was given.
func (h *Helper) finish() {
	close(h.done)
	h.exitMu.Lock()
	fs := h.onExit
	h.onExit = nil
	h.exitMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// OnExit has f run once the helper has exited, on the goroutine that
// reaped it (on one of its own if it has exited already): a supervisor of
// thousands of helpers needs no goroutine of its own waiting for each.
func (h *Helper) OnExit(f func()) {
	h.exitMu.Lock()
	defer h.exitMu.Unlock()
	select {
	case <-h.done:
		// exit has taken its list, or takes it without f.
		go f()
	default:
		h.onExit = append(h.onExit, f)
	}
}

// Pid is the helper's process id (and process group id).
func (h *Helper) Pid() int { return h.pid }

// Done is closed when the helper has exited (and what it held is
// released: StartOptions.AfterExit).
func (h *Helper) Done() <-chan struct{} { return h.done }

// Wait waits for the helper to exit and returns how it did.
func (h *Helper) Wait() error {
	<-h.done
	return h.err
}

// Stop sends SIGTERM to the helper, then SIGKILL if it is still running
// after the grace period, and waits for it. The signals go to the helper's
// pid, not its process group: our helper leaves a root child behind that
// deletes its TAP when the helper is gone, even after a SIGKILL. A helper that
// exits on SIGTERM returns nil (vmnet-helper and ours exit 0); the error of
// one that had to be killed says so.
func (h *Helper) Stop() error {
	select {
	case <-h.reaped:
		<-h.done
		return h.err
	default:
	}
	syscall.Kill(h.Pid(), syscall.SIGTERM)
	t := time.NewTimer(h.grace)
	defer t.Stop()
	select {
	case <-h.reaped:
		<-h.done
		return h.err
	case <-t.C:
	}
	h.kill()
	<-h.done
	return fmt.Errorf("helper %d ignored SIGTERM for %v and was killed", h.Pid(), h.grace)
}

// Tail is the last lines the helper logged (stats lines excluded).
func (h *Helper) Tail() string { return h.tail.String() }

// kill sends SIGKILL to the helper once, if it has not been reaped (its
// pid may be someone else's then).
func (h *Helper) kill() {
	h.once.Do(func() {
		select {
		case <-h.reaped:
		default:
			syscall.Kill(h.Pid(), syscall.SIGKILL)
		}
	})
}

// tail keeps the last max lines.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
	added int // lines added in all
}

// count is how many lines were added.
func (t *tail) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.added
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.added++
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}
