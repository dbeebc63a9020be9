package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testMaintainerScripts runs the packages' own scripts (the .deb's postinst
// and prerm from control, the .rpm's %post and %preun) the way dpkg and rpm
// call them on an install, an upgrade and a removal, with a fake systemctl
// on PATH that records its calls, and checks what they asked of systemd:
// enable and start on a first install, try-restart on an upgrade (never a
// stop or disable: rpm runs the old package's %preun after the new one's
// %post), stop and disable on removal only.
func testMaintainerScripts(t *testing.T, control, rpm string) {
	testutil.RequireRoot(t, "mounts a tmpfs over /run in a mount namespace of its own, where the scripts find /run/systemd/system")
	testutil.RequireCommands(t, "unshare", "mount")
	scripts := map[string]string{}
	for _, s := range []string{"postinst", "prerm"} {
		b, err := os.ReadFile(filepath.Join(control, s))
		if err != nil {
			t.Fatal(err)
		}
		scripts["deb "+s] = writeScript(t, s, b)
	}
	if _, err := exec.LookPath("rpm"); err != nil {
		testutil.Missing(t, "rpm", "install the Debian package rpm (test/setup.sh, run as root, installs it)")
	}
	for tag, name := range map[string]string{"POSTIN": "rpm %post", "PREUN": "rpm %preun"} {
		out := testutil.Run(t, "rpm", "-qp", "--qf", "%{"+tag+"}", rpm)
		if strings.TrimSpace(out) == "(none)" {
			t.Fatalf("%s: none in %s", name, rpm)
		}
		scripts[name] = writeScript(t, tag, []byte(out))
	}

	start := []string{"daemon-reload", "enable --now vmnetctl.service"}
	restart := []string{"daemon-reload", "try-restart vmnetctl.service"}
	stop := []string{"disable --now vmnetctl.service"}
	for _, step := range []struct {
		what   string
		script string
		args   []string
		want   []string
	}{
		{"deb install", "deb postinst", []string{"configure", ""}, start},
		// dpkg's upgrade: the old prerm, then the new postinst.
		{"deb upgrade: old prerm", "deb prerm", []string{"upgrade", "1.2.4"}, nil},
		{"deb upgrade: new postinst", "deb postinst", []string{"configure", "1.2.2"}, restart},
		{"deb remove", "deb prerm", []string{"remove"}, stop},
		{"rpm install", "rpm %post", []string{"1"}, start},
		// rpm's upgrade: the new %post, then the old %preun.
		{"rpm upgrade: new %post", "rpm %post", []string{"2"}, restart},
		{"rpm upgrade: old %preun", "rpm %preun", []string{"1"}, nil},
		{"rpm erase", "rpm %preun", []string{"0"}, stop},
	} {
		if got := runScript(t, scripts[step.script], true, nil, step.args...); !slices.Equal(got, step.want) {
			t.Errorf("%s (%s %q): systemctl calls %q, want %q", step.what, step.script, step.args, got, step.want)
		}
	}
	// Without systemd, or into another root, nothing.
	for name, script := range scripts {
		args := []string{"configure", ""}
		if strings.HasPrefix(name, "rpm") {
			args = []string{"1"}
		}
		if strings.HasSuffix(name, "prerm") || strings.HasSuffix(name, "%preun") {
			args = []string{"remove"}
			if strings.HasPrefix(name, "rpm") {
				args = []string{"0"}
			}
		}
		if got := runScript(t, script, false, nil, args...); len(got) != 0 {
			t.Errorf("%s %q without /run/systemd/system: systemctl calls %q", name, args, got)
		}
		if strings.HasPrefix(name, "deb") {
			if got := runScript(t, script, true, []string{"DPKG_ROOT=/x"}, args...); len(got) != 0 {
				t.Errorf("%s %q with DPKG_ROOT: systemctl calls %q", name, args, got)
			}
		}
	}
}

func writeScript(t *testing.T, name string, b []byte) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// runScript runs a maintainer script with args in a mount namespace where
// /run is a fresh tmpfs, holding /run/systemd/system if systemd is true,
// with a systemctl on PATH that records its arguments, and returns them,
// one call a line.
func runScript(t *testing.T, script string, systemd bool, env []string, args ...string) []string {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>"+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	setup := "mount -t tmpfs tmpfs /run"
	if systemd {
		setup += " && mkdir -p /run/systemd/system"
	}
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", setup + ` && exec /bin/sh "$@"`, "sh", script}, args...)...)
	cmd.Env = append([]string{"PATH=" + dir + ":/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", script, args, err, out)
	}
	b, err := os.ReadFile(calls)
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
