//go:build unix

package helperexec

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// The test binary doubles as a fake helper: HELPEREXEC_FAKE says how to
// behave.
func TestMain(m *testing.M) {
	if mode := os.Getenv("HELPEREXEC_FAKE"); mode != "" {
		os.Exit(fakeHelper(mode))
	}
	os.Exit(m.Run())
}

func fakeHelper(mode string) int {
	term := make(chan os.Signal, 1)
	if mode == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	fmt.Fprintln(os.Stderr, "INFO  [main] running fake helper")
	switch mode {
	case "fail":
		fmt.Fprintln(os.Stderr, `vmnetctl: network "shared" is not up (run `+"`vmnetctl up`)")
		return 1
	case "hang":
		<-term
		return 0
	case "busy":
		// Slow and getting somewhere: a second of CPU before it is
		// ready, as on a busy machine.
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
		}
	case "garbage":
		fmt.Println(`{"vmnet_mtu": 1500}`)
		<-term
		return 0
	}
	if mode == "socket" {
		// The socket appears a little after the line, as with vmnet-helper.
		fmt.Println(`{"vmnet_mac_address":"0a:d6:36:c1:ea:f3","vmnet_max_packet_size":1514}`)
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(os.Getenv("HELPEREXEC_SOCKET"), nil, 0o600)
	} else {
		fmt.Println(`{"vmnet_max_packet_size":1514,"vmnet_mac_address":"0a:d6:36:c1:ea:f3","tap_name":"vmt-x"}`)
	}
	for i := range 3 {
		fmt.Fprintf(os.Stderr, `INFO  [stats] {"time":"2026-11-22T15:00:00Z","host":{"packets":%d},"vm":{"packets":%d}}`+"\n", i, i)
	}
	if mode == "stubborn" {
		time.Sleep(time.Hour)
	}
	<-term
	fmt.Fprintln(os.Stderr, "INFO  [main] stopping: terminated")
	return 0
}

func fake(t *testing.T, mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "HELPEREXEC_FAKE="+mode), env...)
	return cmd
}

func TestStart(t *testing.T) {
	var mu sync.Mutex
	var stats []helperproto.Stats
	h, err := Start(context.Background(), fake(t, "ok"), StartOptions{OnStats: func(s helperproto.Stats) {
		mu.Lock()
		stats = append(stats, s)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Ready.TapName != "vmt-x" || h.Ready.MaxPacketSize != 1514 {
		t.Errorf("Ready = %+v", h.Ready)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(stats)
		mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d stats lines, want 3", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if stats[2].Host.Packets != 2 {
		t.Errorf("last stats = %+v", stats[2])
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Stop() = %v", err)
	}
	if !strings.Contains(h.Tail(), "stopping: terminated") || strings.Contains(h.Tail(), "[stats]") {
		t.Errorf("Tail() = %q", h.Tail())
	}
}

func TestStartSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "helper.sock")
	h, err := Start(context.Background(), fake(t, "socket", "HELPEREXEC_SOCKET="+path), StartOptions{SocketPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Start returned before the socket existed: %v", err)
	}
}

func TestStartFailures(t *testing.T) {
	tests := []struct {
		mode string
		opts StartOptions
		want []string
	}{
		{"fail", StartOptions{}, []string{"exited before it was ready", `network "shared" is not up`, "running fake helper"}},
		{"hang", StartOptions{StallTimeout: 200 * time.Millisecond}, []string{"made no progress for 200ms (state S", "running fake helper"}},
		{"garbage", StartOptions{}, []string{"vmnet_mac_address is missing"}},
		{"ok", StartOptions{SocketPath: "/nonexistent/helper.sock", StallTimeout: 200 * time.Millisecond}, []string{"did not create /nonexistent/helper.sock"}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			_, err := Start(context.Background(), fake(t, tt.mode), tt.opts)
			if err == nil {
				t.Fatal("Start() succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Start() error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestStartWaitsForProgress: a helper that takes five times the stall
// window but uses the CPU all along is waited for, not failed; one that
// sleeps (TestStartFailures' hang) is.
func TestStartWaitsForProgress(t *testing.T) {
	h, err := Start(context.Background(), fake(t, "busy"), StartOptions{StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("a helper busy for 1s with a stall window of 200ms: %v", err)
	}
	h.Stop()
}

func TestStopKillsStubbornHelper(t *testing.T) {
	h, err := Start(context.Background(), fake(t, "stubborn"), StartOptions{StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = h.Stop()
	if err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Errorf("Stop() = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop took %v", d)
	}
}

func TestStartContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Start(ctx, fake(t, "hang"), StartOptions{})
	if err == nil || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Errorf("Start() = %v", err)
	}
}

// TestStartWithFiles: the helper's output goes to files, so it would outlive
// its starter; readiness, failures and the log work as with pipes.
func TestStartWithFiles(t *testing.T) {
	dir := t.TempDir()
	ready, logf := filepath.Join(dir, "h.json"), filepath.Join(dir, "h.log")
	sock := filepath.Join(dir, "h.sock")
	h, err := Start(context.Background(), fake(t, "socket", "HELPEREXEC_SOCKET="+sock), StartOptions{ReadyFile: ready, LogFile: logf, SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	if h.Ready.MaxPacketSize != 1514 {
		t.Errorf("Ready = %+v", h.Ready)
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Stop() = %v", err)
	}
	data, _ := os.ReadFile(logf)
	if !strings.Contains(string(data), "INFO  [stats]") || !strings.Contains(string(data), "stopping: terminated") {
		t.Errorf("log file:\n%s", data)
	}

	_, err = Start(context.Background(), fake(t, "fail"), StartOptions{ReadyFile: ready, LogFile: logf})
	if err == nil || !strings.Contains(err.Error(), `network "shared" is not up`) || strings.Contains(err.Error(), "stopping: terminated") {
		t.Errorf("a failing helper in file mode: %v (want only its new log lines)", err)
	}
}

// TestOnExit: what OnExit is given runs once the helper has exited, after
// Done is closed, whether it was given before the exit or after.
func TestOnExit(t *testing.T) {
	for _, files := range []bool{false, true} {
		opts := StartOptions{}
		if files {
			dir := t.TempDir()
			opts.ReadyFile, opts.LogFile = filepath.Join(dir, "h.json"), filepath.Join(dir, "h.log")
		}
		h, err := Start(context.Background(), fake(t, "ok"), opts)
		if err != nil {
			t.Fatal(err)
		}
		before := make(chan bool, 1)
		h.OnExit(func() {
			select {
			case <-h.Done():
				before <- true
			default:
				before <- false
			}
		})
		select {
		case <-before:
			t.Fatalf("files %v: OnExit ran while the helper runs", files)
		default:
		}
		if err := h.Stop(); err != nil {
			t.Fatal(err)
		}
		if done := <-before; !done {
			t.Errorf("files %v: OnExit ran before Done was closed", files)
		}
		after := make(chan struct{})
		h.OnExit(func() { close(after) })
		<-after
	}
}

// BenchmarkStartWithFiles is a helper's start in file mode, from its exec
// to its ready line read (its stop not counted): the ready line is seen
// when it is written (a watch of its file), not at a poll's next look.
func BenchmarkStartWithFiles(b *testing.B) {
	dir := b.TempDir()
	opts := StartOptions{ReadyFile: filepath.Join(dir, "h.json"), LogFile: filepath.Join(dir, "h.log")}
	for range b.N {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "HELPEREXEC_FAKE=ready")
		h, err := Start(context.Background(), cmd, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		h.Stop()
		b.StartTimer()
	}
}

// BenchmarkStartFailsWithFiles is a helper that exits before its ready
// line, from its exec to Start's error: its exit ends the wait on the
// ready file at once.
func BenchmarkStartFailsWithFiles(b *testing.B) {
	dir := b.TempDir()
	opts := StartOptions{ReadyFile: filepath.Join(dir, "h.json"), LogFile: filepath.Join(dir, "h.log")}
	for b.Loop() {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "HELPEREXEC_FAKE=fail")
		if _, err := Start(context.Background(), cmd, opts); err == nil {
			b.Fatal("a failing helper started")
		}
	}
}

// TestAfterExit: StartOptions.AfterExit runs once, after the helper has
// exited and before Done, whether it was stopped, exited of itself, or
// failed to start.
func TestAfterExit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cmd   func() *exec.Cmd
		start bool
	}{
		{"stopped", func() *exec.Cmd { return fake(t, "ok") }, true},
		{"failed", func() *exec.Cmd { return fake(t, "fail") }, false},
		{"not started", func() *exec.Cmd { return exec.Command(filepath.Join(t.TempDir(), "no-such-helper")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			var h *Helper
			afterExit := func() {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if h != nil {
					select {
					case <-h.Done():
						t.Error("AfterExit ran after Done was closed")
					default:
					}
				}
			}
			started, err := Start(context.Background(), tc.cmd(), StartOptions{AfterExit: afterExit})
			mu.Lock()
			h = started
			mu.Unlock()
			if tc.start != (err == nil) {
				t.Fatalf("Start: %v", err)
			}
			if err == nil {
				if err := h.Stop(); err != nil {
					t.Fatal(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if calls != 1 {
				t.Errorf("AfterExit ran %d times, want once", calls)
			}
		})
	}
}
