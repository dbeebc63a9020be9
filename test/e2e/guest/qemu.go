package guest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// Config describes one guest.
type Config struct {
	// Name labels the guest in logs and file names. Default: "guest".
	Name string
	// Image to boot. Default (Boot/Run only): SharedImage.
	Image *Image
	// Script is the check script. Required.
	Script *Script
	// NetArgs are raw qemu arguments for the network devices, e.g. from
	// NetTap, NetDgramUnix or NetDgramFD. Interfaces appear in the guest as
	// eth0, eth1, ... in the order of the -device arguments.
	NetArgs []string
	// ExtraFiles are inherited by qemu as fds 3, 4, ... (see FD).
	ExtraFiles []*os.File
	// Netns, if set, runs qemu in that named network namespace
	// (`ip netns exec NETNS qemu-system-x86_64 ...`).
	Netns string
	// MemoryMB is the guest RAM. Default 256.
	MemoryMB int
	// Accel is "tcg" or "kvm". Default: $VMNETCTL_E2E_ACCEL, else "tcg".
	Accel string
	// Machine is the qemu machine type. Default "q35".
	Machine string
	// Timeout bounds the whole run, boot included. Default:
	// $VMNETCTL_E2E_TIMEOUT (a Go duration), else 3 minutes.
	Timeout time.Duration
	// Dir receives the console log (NAME.console.log). Default (Boot/Run):
	// tb.ArtifactDir(), kept with `go test -artifacts`; (Start): a new temp
	// dir.
	Dir string
	// WorkDir receives the per-guest initrd (NAME.initrd). Default
	// (Boot/Run): tb.TempDir(); (Start): Dir.
	WorkDir string
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// ExtraArgs are appended to the qemu command line.
	ExtraArgs []string
	// Stdout, if set, receives a copy of the console output as it arrives.
	Stdout io.Writer
	// Wrapper, if set, is a command that runs qemu: the qemu command line
	// is appended to it (e.g. `vmnetctl run -f vms.yaml --vm a --`). The
	// console is the wrapper's stdout, and Result.ExitCode is its status.
	// The wrapper runs in its own process group, which Kill signals.
	Wrapper []string
}

// Result is what a guest reported.
type Result struct {
	Name     string
	Values   map[string]string // E2E key=value lines (value trimmed); a repeated key keeps the last value
	Done     bool              // "E2E done" seen: the script ran to its end
	Failure  string            // first "E2E fail" reason, if any
	Console  string            // the whole serial console output
	LogPath  string            // file with the console output
	BootTime time.Duration     // from qemu start to /init running
	Elapsed  time.Duration     // from qemu start to qemu exit (or kill)
	Command  []string          // qemu command line
	// ExitCode is qemu's (or the wrapper's) exit status once it has exited:
	// -1 if it was killed by a signal or has not exited.
	ExitCode int
}

// Get returns the value reported for key.
func (r *Result) Get(key string) (string, bool) {
	v, ok := r.Values[key]
	return v, ok
}

// Tail returns the last n lines of the console.
func (r *Result) Tail(n int) string { return tail(r.Console, n) }

// Expect reports a test error unless key was reported with value want.
func (r *Result) Expect(tb testing.TB, key, want string) {
	tb.Helper()
	got, ok := r.Values[key]
	switch {
	case !ok:
		tb.Errorf("%s: %s not reported (console %s)\n%s", r.Name, key, r.LogPath, r.Tail(30))
	case got != want:
		tb.Errorf("%s: %s = %q, want %q (console %s); the console before it:\n%s", r.Name, key, got, want, r.LogPath, r.Before("E2E "+key+"=", 15))
	}
}

// Before returns up to n console lines before the first line that starts
// with prefix: what a check printed on its way to a wrong value (the
// console file is gone once CI ends).
func (r *Result) Before(prefix string, n int) string {
	lines := strings.Split(r.Console, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimRight(l, "\r"), prefix) {
			return strings.Join(lines[max(0, i-n):i], "\n")
		}
	}
	return ""
}

// Guest is a running qemu.
type Guest struct {
	cfg     Config
	cmd     *exec.Cmd
	start   time.Time
	logPath string
	logFile *os.File

	mu       sync.Mutex
	console  bytes.Buffer
	values   map[string]string
	done     bool
	failure  string
	bootTime time.Duration

	finished   chan struct{} // closed on "E2E done" or "E2E fail"
	finishOnce sync.Once
	exited     chan struct{} // closed when qemu has exited and output is read
	waitErr    error
	stderr     bytes.Buffer
	killOnce   sync.Once
}

// Start boots a guest. The caller must call Wait or Kill.
func Start(cfg Config) (*Guest, error) {
	if cfg.Image == nil {
		return nil, errors.New("guest: Config.Image is nil")
	}
	if cfg.Script == nil {
		return nil, errors.New("guest: Config.Script is nil")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("%w: qemu-system-x86_64 (install qemu-system-x86)", ErrMissing)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	initrd := filepath.Join(cfg.WorkDir, cfg.Name+".initrd")
	if err := writeGuestInitrd(initrd, cfg.Image.Initrd, cfg.Script); err != nil {
		return nil, err
	}
	args, err := cfg.commandLine(qemu, initrd)
	if err != nil {
		return nil, err
	}
	g := &Guest{
		cfg:      cfg,
		values:   map[string]string{},
		finished: make(chan struct{}),
		exited:   make(chan struct{}),
		logPath:  filepath.Join(cfg.Dir, cfg.Name+".console.log"),
	}
	if err := g.run(args); err != nil {
		return nil, err
	}
	return g, nil
}

// setDefaults fills in what the config leaves out.
func (cfg *Config) setDefaults() error {
	if cfg.Name == "" {
		cfg.Name = "guest"
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = 256
	}
	cfg.Accel = cmp.Or(cfg.Accel, os.Getenv("VMNETCTL_E2E_ACCEL"), "tcg")
	cfg.Machine = cmp.Or(cfg.Machine, "q35")
	if cfg.Timeout == 0 {
		if d, err := time.ParseDuration(os.Getenv("VMNETCTL_E2E_TIMEOUT")); err == nil && d > 0 {
			cfg.Timeout = d
		} else {
			cfg.Timeout = 3 * time.Minute
		}
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "vmnetctl-e2e-"+cfg.Name+"-")
		if err != nil {
			return err
		}
		cfg.Dir = d
	}
	cfg.WorkDir = cmp.Or(cfg.WorkDir, cfg.Dir)
	return nil
}

// commandLine is qemu's command line for the guest, with its namespace and
// wrapper in front.
func (cfg *Config) commandLine(qemu, initrd string) ([]string, error) {
	var args []string
	if cfg.Netns != "" {
		args = append(args, "ip", "netns", "exec", cfg.Netns)
	}
	args = append(args, cfg.Wrapper...)
	args = append(args, qemu,
		"-name", cfg.Name,
		"-machine", cfg.Machine,
		"-m", fmt.Sprint(cfg.MemoryMB),
		"-smp", "1",
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot",
		"-serial", "stdio",
		"-kernel", bootKernel(cfg.Image),
		"-initrd", initrd,
		"-append", strings.Join(append([]string{
			"console=ttyS0", "quiet", "loglevel=1", "panic=-1",
			"8250.nr_uarts=1", "i8042.noaux", "i8042.nokbd", "i8042.nopnp",
			"random.trust_cpu=on", "mitigations=off",
		}, cfg.KernelArgs...), " "),
	)
	switch cfg.Accel {
	case "kvm":
		args = append(args, "-accel", "kvm", "-cpu", "host")
	case "tcg":
		args = append(args, "-accel", "tcg")
	default:
		return nil, fmt.Errorf("guest: unknown accel %q (want tcg or kvm)", cfg.Accel)
	}
	args = append(args, cfg.NetArgs...)
	return append(args, cfg.ExtraArgs...), nil
}

// run starts qemu with its console logged and read.
func (g *Guest) run(args []string) error {
	var err error
	g.logFile, err = os.Create(g.logPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(g.logFile, "# %s\n", strings.Join(args, " "))
	g.cmd = exec.Command(args[0], args[1:]...)
	g.cmd.ExtraFiles = g.cfg.ExtraFiles
	g.cmd.Stderr = &lockedWriter{mu: &g.mu, w: &g.stderr}
	g.cmd.SysProcAttr = sysProcAttr()
	if len(g.cfg.Wrapper) > 0 {
		setpgid(g.cmd.SysProcAttr)
	}
	stdout, err := g.cmd.StdoutPipe()
	if err != nil {
		g.logFile.Close()
		return err
	}
	g.start = time.Now()
	if err := g.cmd.Start(); err != nil {
		g.logFile.Close()
		return fmt.Errorf("guest %s: %w", g.cfg.Name, err)
	}
	go g.read(stdout)
	return nil
}

// Boot starts a guest for a test and kills it on test cleanup. Defaults:
// Image = SharedImage(tb), Dir = tb.ArtifactDir(), WorkDir = tb.TempDir().
// A missing qemu skips the test, or fails it with CI=true.
func Boot(tb testing.TB, cfg Config) *Guest {
	tb.Helper()
	if cfg.Image == nil {
		cfg.Image = SharedImage(tb)
	}
	if cfg.Dir == "" {
		cfg.Dir = tb.ArtifactDir()
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = tb.TempDir()
	}
	g, err := Start(cfg)
	if errors.Is(err, ErrMissing) {
		testutil.Missing(tb, "e2e guest: "+err.Error(), setupHint)
	}
	if err != nil {
		tb.Fatalf("e2e guest: %v", err)
	}
	tb.Cleanup(g.Kill)
	return g
}

// Run boots a guest, waits for its result and fails the test (with the
// console tail) if the guest timed out, failed or did not finish.
func Run(tb testing.TB, cfg Config) *Result {
	tb.Helper()
	return Boot(tb, cfg).MustWait(tb)
}

// MustWait is Wait that fails the test with the console tail on error or
// when the guest did not report "E2E done".
func (g *Guest) MustWait(tb testing.TB) *Result {
	tb.Helper()
	r, err := g.Wait()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if !r.Done {
		tb.Fatalf("guest %s failed: %s (console %s)\n%s", r.Name, r.Failure, r.LogPath, r.Tail(40))
	}
	return r
}

// Wait waits until the guest reports "E2E done" or "E2E fail" and qemu
// exits, or the timeout passes (then qemu is killed). The error is set on a
// timeout or when qemu exits without a final line; it includes the console
// tail. A guest-side failure is not an error: see Result.Failure.
func (g *Guest) Wait() (*Result, error) {
	deadline := time.NewTimer(time.Until(g.start.Add(g.cfg.Timeout)))
	defer deadline.Stop()
	var err error
	select {
	case <-g.finished:
		// The guest powers off right after its final line; give qemu a
		// moment to exit by itself.
		select {
		case <-g.exited:
		case <-time.After(15 * time.Second):
			g.Kill()
			<-g.exited
		}
	case <-g.exited:
	case <-deadline.C:
		g.Kill()
		<-g.exited
		err = fmt.Errorf("guest %s: timed out after %v", g.cfg.Name, g.cfg.Timeout)
	}
	r := g.result()
	if err == nil && !r.Done && r.Failure == "" {
		err = fmt.Errorf("guest %s: qemu exited (%v) without a result", g.cfg.Name, g.waitErr)
	}
	if err != nil {
		g.mu.Lock()
		stderr := g.stderr.String()
		g.mu.Unlock()
		err = fmt.Errorf("%w\nqemu: %s\nqemu stderr: %s\nconsole (%s), last lines:\n%s",
			err, strings.Join(r.Command, " "), strings.TrimSpace(stderr), r.LogPath, r.Tail(40))
	}
	return r, err
}

// Kill kills qemu (if running) and waits for it. Safe to call repeatedly.
func (g *Guest) Kill() {
	g.killOnce.Do(func() {
		select {
		case <-g.exited:
		default:
			if len(g.cfg.Wrapper) > 0 {
				// Let the wrapper stop what it started, then kill the group.
				killGroup(g.cmd.Process.Pid, false)
				select {
				case <-g.exited:
					return
				case <-time.After(10 * time.Second):
				}
				killGroup(g.cmd.Process.Pid, true)
			}
			g.cmd.Process.Kill()
		}
	})
	<-g.exited
}

// Value returns the value the guest has reported for key so far.
func (g *Guest) Value(key string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, ok := g.values[key]
	return v, ok
}

// Await waits up to timeout for the guest to report key and returns the
// value. It returns an error if the guest finishes or exits first, or the
// timeout passes.
func (g *Guest) Await(key string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if v, ok := g.Value(key); ok {
			return v, nil
		}
		select {
		case <-g.finished:
			if v, ok := g.Value(key); ok {
				return v, nil
			}
			return "", fmt.Errorf("guest %s finished without reporting %s (console %s)", g.cfg.Name, key, g.logPath)
		case <-g.exited:
			return "", fmt.Errorf("guest %s exited without reporting %s (console %s)", g.cfg.Name, key, g.logPath)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("guest %s: %s not reported within %v (console %s)", g.cfg.Name, key, timeout, g.logPath)
		}
	}
}

// LogPath is the file the console output is written to.
func (g *Guest) LogPath() string { return g.logPath }

func (g *Guest) result() *Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := &Result{
		Name:     g.cfg.Name,
		Values:   map[string]string{},
		Done:     g.done,
		Failure:  g.failure,
		Console:  g.console.String(),
		LogPath:  g.logPath,
		BootTime: g.bootTime,
		Elapsed:  time.Since(g.start),
		Command:  g.cmd.Args,
		ExitCode: -1,
	}
	select {
	case <-g.exited:
		r.ExitCode = g.cmd.ProcessState.ExitCode()
	default:
	}
	for k, v := range g.values {
		r.Values[k] = v
	}
	return r
}

func (g *Guest) read(stdout io.Reader) {
	br := bufio.NewReader(stdout)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			g.line(line)
		}
		if err != nil {
			break
		}
	}
	g.waitErr = g.cmd.Wait()
	fmt.Fprintf(g.logFile, "# qemu exited after %v: %v\n", time.Since(g.start).Round(time.Millisecond), g.waitErr)
	g.mu.Lock()
	if s := g.stderr.String(); s != "" {
		fmt.Fprintf(g.logFile, "# qemu stderr:\n%s", s)
	}
	g.mu.Unlock()
	g.logFile.Close()
	close(g.exited)
}

func (g *Guest) line(raw string) {
	line := strings.TrimRight(strings.ReplaceAll(raw, "\r", ""), "\n")
	fmt.Fprintf(g.logFile, "[%7.3f] %s\n", time.Since(g.start).Seconds(), line)
	if g.cfg.Stdout != nil {
		io.WriteString(g.cfg.Stdout, line+"\n")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.console.WriteString(line + "\n")
	i := strings.Index(line, "E2E ")
	if i < 0 {
		return
	}
	msg := line[i+4:]
	word, rest, _ := strings.Cut(msg, " ")
	switch {
	case word == "boot":
		if g.bootTime == 0 {
			g.bootTime = time.Since(g.start)
		}
	case word == "done":
		if g.failure == "" {
			g.done = true
		}
		g.finishOnce.Do(func() { close(g.finished) })
	case word == "fail":
		if g.failure == "" {
			g.failure = rest
		}
		g.done = false
		g.finishOnce.Do(func() { close(g.finished) })
	default:
		if k, v, ok := strings.Cut(msg, "="); ok {
			g.values[k] = strings.TrimSpace(v)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// writeGuestInitrd writes the base initramfs followed by a gzip newc archive
// holding /e2e/script.sh (the kernel unpacks concatenated archives in order).
func writeGuestInitrd(path, base string, s *Script) error {
	data, err := os.ReadFile(base)
	if err != nil {
		return err
	}
	buf := bytes.NewBuffer(data)
	for buf.Len()%4 != 0 {
		buf.WriteByte(0)
	}
	if err := writeGzipCPIO(buf, []cpioEntry{
		{Name: "e2e", Mode: modeDir | 0o755},
		{Name: "e2e/script.sh", Mode: modeRegular | 0o644, Data: []byte(s.String())},
	}); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func bootKernel(img *Image) string {
	if img.BootKernel != "" {
		return img.BootKernel
	}
	return img.Kernel
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Network device helpers: each returns -netdev and -device arguments for a
// virtio-net-pci NIC with the given netdev id and MAC.

// NetTap attaches to an existing TAP device ifname (no scripts). Run qemu in
// the TAP's network namespace (Config.Netns).
func NetTap(id, ifname, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("tap,id=%s,ifname=%s,script=no,downscript=no", id, ifname),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, mac),
	}
}

// NetDgramUnix sends frames from the unix datagram socket it binds at local
// to the one at remote (vmnet-helper style).
func NetDgramUnix(id, local, remote, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=%s,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s", id, local, remote),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, mac),
	}
}

// NetDgramFD uses an inherited, connected datagram socket: fd is its number
// in qemu (FD(i) for Config.ExtraFiles[i]).
func NetDgramFD(id string, fd int, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=%s,local.type=fd,local.str=%d", id, fd),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, mac),
	}
}

// NetTapFD is a virtio-net NIC on the TAP descriptor fd that qemu inherits
// (`vmnetctl run`'s kernel path for an `attach: tap` attachment).
func NetTapFD(id string, fd int, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("tap,id=%s,fd=%d", id, fd),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, mac),
	}
}

// FD returns the fd number qemu sees for Config.ExtraFiles[i].
func FD(i int) int { return 3 + i }

// MAC returns a locally administered MAC address 52:54:00:e2:HI:LO for n.
func MAC(n int) string { return fmt.Sprintf("52:54:00:e2:%02x:%02x", (n>>8)&0xff, n&0xff) }

// StartContext is Start, and kills the guest when ctx is done.
func StartContext(ctx context.Context, cfg Config) (*Guest, error) {
	g, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			g.Kill()
		case <-g.exited:
		}
	}()
	return g, nil
}
