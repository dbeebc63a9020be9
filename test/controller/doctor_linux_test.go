package controller_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/doctor"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// nobodyBinary is a copy of vmnetctl's binary in a directory of its own
// that user nobody may run and write to.
func nobodyBinary(t *testing.T, h *host) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmnd-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	b, err := os.ReadFile(h.Binary)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "vmnetctl")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// asNobody is setpriv's arguments running bin args as user nobody.
func asNobody(bin string, args ...string) []string {
	return append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups", bin}, args...)
}

func doctorReport(t *testing.T, out []byte) *doctor.Report {
	t.Helper()
	var r doctor.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	return &r
}

func finding(r *doctor.Report, check string) doctor.Finding {
	for _, f := range r.Findings {
		if f.Check == check {
			return f
		}
	}
	return doctor.Finding{}
}

// doctor checks the networks of record of --state-dir (a subnet the
// built-in networks do not have), as up and plan would use them; without
// root it does not report the kernel features it may not probe as missing.
// Man pages built by a user carry no user's runtime dir.
func TestDoctorAndManWithoutRoot(t *testing.T) {
	testutil.RequireCommands(t, "setpriv")
	h := newHost(t)
	bin := nobodyBinary(t, h)
	h.MustVmnetctl("up", "-f", h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n"))

	// No --networks: the networks of record (10.77.0.0/24), not the built-in ones.
	cmd := h.NS.Command(context.Background(), h.Binary, "--state-dir", h.StateDir(), "doctor", "--json")
	cmd.Env = append(os.Environ(), "VMNETCTL_NETWORKS=")
	out, _ := cmd.Output()
	if f := finding(doctorReport(t, out), "subnet of shared"); !strings.HasPrefix(f.Detail, "10.77.0.0/24 ") {
		t.Errorf("doctor --state-dir: subnet of shared: %+v, want the networks of record's 10.77.0.0/24", f)
	}

	// As nobody: the state dir cannot be read, the probe namespace cannot
	// be made.
	cmd = h.NS.Command(context.Background(), "setpriv", asNobody(bin, "--state-dir", h.StateDir(), "doctor", "--json")...)
	cmd.Env = append(os.Environ(), "VMNETCTL_NETWORKS=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ = cmd.Output()
	r := doctorReport(t, out)
	for _, k := range []string{"kernel: bridge", "kernel: nftables"} {
		if f := finding(r, k); f.Status != doctor.Info || f.Detail != "not checked: needs root (sudo vmnetctl doctor)" || f.Fix != "" {
			t.Errorf("doctor as nobody: %s: %+v, want info: not checked: needs root", k, f)
		}
	}
	if !strings.Contains(stderr.String(), "run with sudo to check them") {
		t.Errorf("doctor as nobody, stderr: %s", stderr.String())
	}

	// man as nobody, with a runtime dir of its own.
	man := filepath.Join(filepath.Dir(bin), "man")
	c := exec.Command("setpriv", asNobody(bin, "man", man)...)
	c.Env = append(os.Environ(), "XDG_RUNTIME_DIR=/run/user/65534")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("man as nobody: %v\n%s", err, out)
	}
	pages, _ := filepath.Glob(filepath.Join(man, "*.8"))
	if len(pages) < 10 {
		t.Fatalf("man pages: %v", pages)
	}
	for _, p := range pages {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), "/run/user/") {
			t.Errorf("%s carries the builder's runtime dir", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(man, "vmnetctl-up.8")); !strings.Contains(string(b), "XDG_RUNTIME_DIR") {
		t.Errorf("vmnetctl-up.8 does not describe --state-dir's default:\n%s", b)
	}
}
