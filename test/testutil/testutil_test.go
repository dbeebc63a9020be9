package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records Skipf, Fatalf and Errorf instead
// of ending the test (they end a goroutine of its own).
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recorder) Errorf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

// call runs f with a recorder and returns it once f returns or "ends the test".
func call(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		f(r)
	}()
	return r
}

func TestMissingSkipsOrFailsInCI(t *testing.T) {
	for _, tt := range []struct {
		ci         string
		skip, fail bool
	}{{"", true, false}, {"false", true, false}, {"true", false, true}, {"1", false, true}} {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			r := call(t, func(tb testing.TB) { RequireCommands(tb, "sh", "no-such-command-vmnetctl") })
			if (r.skipped != "") != tt.skip || (r.failed != "") != tt.fail {
				t.Fatalf("skipped %q, failed %q", r.skipped, r.failed)
			}
			msg := r.skipped + r.failed
			if !strings.Contains(msg, "no-such-command-vmnetctl") || !strings.Contains(msg, "put it on PATH") {
				t.Errorf("the message names neither what is missing nor how to get it: %s", msg)
			}
		})
	}
	t.Setenv("CI", "true")
	if r := call(t, func(tb testing.TB) { RequireCommands(tb, "sh") }); r.skipped != "" || r.failed != "" {
		t.Errorf("sh is there: skipped %q, failed %q", r.skipped, r.failed)
	}
	if got := InstallHint("promtool"); !strings.Contains(got, "prometheus") {
		t.Errorf("InstallHint(promtool) = %q", got)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, 5*time.Second, func() bool { n++; return n == 3 }, "the third call")
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
	r := call(t, func(tb testing.TB) {
		Eventually(tb, 50*time.Millisecond, func() error { return errors.New("not yet") }, "%s to happen", "it")
	})
	if !strings.Contains(r.failed, "waiting for it to happen: still not true after 50ms: not yet") {
		t.Errorf("timeout message: %q", r.failed)
	}
	start := time.Now()
	r = call(t, func(tb testing.TB) {
		Eventually(tb, time.Minute, func() error { return Permanent(errors.New("it exited")) })
	})
	if !strings.Contains(r.failed, "it exited") || time.Since(start) > 10*time.Second {
		t.Errorf("Permanent: %q after %v", r.failed, time.Since(start))
	}
}

func TestGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "testdata", "x.golden")
	if r := call(t, func(tb testing.TB) { Golden(tb, path, "a\n") }); !strings.Contains(r.failed, "go test -update creates it") {
		t.Errorf("missing golden file: %q", r.failed)
	}
	*update = true
	Golden(t, path, "a\n")
	*update = false
	if b, err := os.ReadFile(path); err != nil || string(b) != "a\n" {
		t.Fatalf("-update wrote %q, %v", b, err)
	}
	Golden(t, path, "a\n")
	if r := call(t, func(tb testing.TB) { Golden(tb, path, "b\n") }); !strings.Contains(r.failed, "output differs from "+path) {
		t.Errorf("different output: %q", r.failed)
	}
}

func TestInRange(t *testing.T) {
	for addr, ok := range map[string]bool{
		"10.0.0.100": true, "10.0.0.150": true, "10.0.0.120": true,
		"10.0.0.1": false, "10.0.0.10": false, "10.0.0.15": false, "10.0.0.151": false, "10.0.0.1000": false, "": false,
	} {
		if err := InRange(addr, "10.0.0.100", "10.0.0.150"); (err == nil) != ok {
			t.Errorf("InRange(%q) = %v, want ok %v", addr, err, ok)
		}
	}
}

// TestSmuggledTail: the tail is a POST whose head and padding take rest
// bytes, then evil, and whose Content-Length is its padding and evil.
func TestSmuggledTail(t *testing.T) {
	evil := "GET /secret HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	for _, rest := range []int{200, 999, 1000, 50000} {
		tail := SmuggledTail(rest, evil)
		head, body, ok := strings.Cut(tail, "\r\n\r\n")
		_, cl, _ := strings.Cut(head, "Content-Length: ")
		if len(tail) != rest+len(evil) || !ok || cl != strconv.Itoa(len(body)) || !strings.HasSuffix(body, evil) {
			t.Errorf("SmuggledTail(%d): %d bytes, Content-Length %q for a body of %d", rest, len(tail), cl, len(body))
		}
	}
}
