// Package packaging builds the .deb and .rpm (`make packages`) and checks
// what a user installs: the binary runs, the default networks.yaml is a
// config file that loads, the systemd unit starts the controller as a
// service, and nftables is a dependency.
package packaging

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

func TestPackages(t *testing.T) {
	testutil.RequireCommands(t, "make", "dpkg-deb")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Everything it builds goes to the test's own dirs, nothing into the
	// source tree (where another build or a user's files may be).
	dist, build := t.TempDir(), t.TempDir()
	inTree := []string{filepath.Join(root, "bin/vmnetctl"), filepath.Join(root, "build/pkg")}
	before := treeStamps(inTree)
	cmd := exec.Command("make", "-C", root, "packages", "BIN="+filepath.Join(build, "vmnetctl"), "PKG_BUILD="+filepath.Join(build, "pkg"), "DIST="+dist)
	cmd.Env = append(os.Environ(), "PKG_VERSION=1.2.3")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make packages: %v\n%s", err, out)
	}
	if after := treeStamps(inTree); after != before {
		t.Errorf("make packages with BIN, PKG_BUILD and DIST wrote into the source tree: %s, was %s", after, before)
	}
	// vmnetctl-relay, started once an attachment, is static: no dynamic
	// loader to run at each start.
	if f, err := elf.Open(filepath.Join(build, "vmnetctl-relay")); err != nil {
		t.Error(err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("vmnetctl-relay is dynamically linked (it has an interpreter)")
			}
		}
		f.Close()
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "vmnetctl_1.2.3_*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(dist, "vmnetctl-1.2.3-1.*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("packages in %s: %v %v", dist, debs, rpms)
	}
	deb, rpm := debs[0], rpms[0]

	// The same files in both, the zsh completion where each system's zsh
	// looks and the license where each system keeps it; completions and
	// the license are not empty.
	zsh := map[string]string{"deb": "/usr/share/zsh/vendor-completions/_vmnetctl", "rpm": "/usr/share/zsh/site-functions/_vmnetctl"}
	license := map[string]string{"deb": "/usr/share/doc/vmnetctl/copyright", "rpm": "/usr/share/licenses/vmnetctl/LICENSE"}
	debFiles := debContents(t, deb)
	t.Run("rpm contents", func(t *testing.T) {
		if _, err := exec.LookPath("rpm"); err != nil {
			testutil.Missing(t, "rpm", "install the Debian package rpm (test/setup.sh, run as root, installs it)")
		}
		checkContents(t, "rpm", rpmContents(t, rpm), zsh["rpm"], license["rpm"])
	})
	checkContents(t, "deb", debFiles, zsh["deb"], license["deb"])
	if dep := testutil.Run(t, "dpkg-deb", "-f", deb, "Depends"); !strings.Contains(dep, "nftables") {
		t.Errorf("Depends: %q, want nftables", dep)
	}
	control := t.TempDir()
	testutil.Run(t, "dpkg-deb", "-e", deb, control)
	if b, _ := os.ReadFile(filepath.Join(control, "conffiles")); !strings.Contains(string(b), "/etc/vmnetctl/networks.yaml") {
		t.Errorf("conffiles %q: networks.yaml is not a config file (an edited one would be overwritten on upgrade)", b)
	}
	t.Run("maintainer scripts", func(t *testing.T) { testMaintainerScripts(t, control, rpm) })

	// What is installed works: the binary, the networks.yaml, the unit's
	// command line.
	tree := t.TempDir()
	testutil.Run(t, "dpkg-deb", "-x", deb, tree)
	bin := filepath.Join(tree, "usr/bin/vmnetctl")
	if out := testutil.Run(t, bin, "--networks", filepath.Join(tree, "etc/vmnetctl/networks.yaml"), "networks"); !strings.Contains(out, "shared") {
		t.Errorf("vmnetctl networks with the packaged networks.yaml:\n%s", out)
	}
	unit, err := os.ReadFile(filepath.Join(tree, "usr/lib/systemd/system/vmnetctl.service"))
	if err != nil {
		t.Fatal(err)
	}
	keys := unitKeys(string(unit))
	// Ready once it serves; the state dir /run/vmnetctl made by systemd and
	// kept across restarts (the helpers' records); a stop or restart ends
	// the controller alone, not its helpers; restarted when it fails.
	for k, want := range map[string]string{"Type": "notify", "RuntimeDirectory": "vmnetctl", "RuntimeDirectoryPreserve": "yes",
		"KillMode": "process", "Restart": "on-failure", "WantedBy": "multi-user.target"} {
		if got := keys[k]; got != want {
			t.Errorf("unit: %s=%q, want %q", k, got, want)
		}
	}
	execStart := keys["ExecStart"]
	argv := strings.Fields(execStart)
	if len(argv) < 2 || argv[0] != "/usr/bin/vmnetctl" {
		t.Fatalf("unit: ExecStart=%q, want /usr/bin/vmnetctl ...:\n%s", execStart, unit)
	}
	// The unit's flags are the binary's: --help parses them without running.
	if out, err := exec.Command(bin, append(argv[1:], "--help")...).CombinedOutput(); err != nil || !strings.Contains(string(out), "--exit-when-idle") {
		t.Errorf("%s --help: %v\n%s", execStart, err, out)
	}
	t.Run("systemd-analyze verify", func(t *testing.T) {
		p, err := exec.LookPath("systemd-analyze")
		if err != nil {
			testutil.Missing(t, "systemd-analyze", "install the Debian package systemd (test/setup.sh, run as root, installs it)")
		}
		// The binary is not installed at /usr/bin here: that is the one
		// complaint allowed.
		out, _ := exec.Command(p, "verify", "--man=no", filepath.Join(tree, "usr/lib/systemd/system/vmnetctl.service")).CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "vmnetctl.service") && !strings.Contains(l, "/usr/bin/vmnetctl is not executable") {
				t.Errorf("systemd-analyze verify: %s", l)
			}
		}
		// The sandbox: systemd's exposure score under 5 ("OK").
		out, _ = exec.Command(p, "security", "--offline=true", filepath.Join(tree, "usr/lib/systemd/system/vmnetctl.service")).CombinedOutput()
		var score float64
		for _, l := range strings.Split(string(out), "\n") {
			if _, rest, ok := strings.Cut(l, "Overall exposure level for vmnetctl.service: "); ok {
				fmt.Sscanf(rest, "%g", &score)
			}
		}
		if score == 0 || score >= 5 {
			t.Errorf("systemd-analyze security: exposure %.1f, want under 5:\n%s", score, out)
		}
	})

	// The .deb installs with dpkg (into a root of the test's own, so the
	// host's /usr and services are not touched; its scripts see DPKG_ROOT
	// and leave systemd alone) and what it installed runs.
	inst := t.TempDir()
	for _, d := range []string{"info", "updates", "triggers"} {
		os.MkdirAll(filepath.Join(inst, "var/lib/dpkg", d), 0o755)
	}
	os.WriteFile(filepath.Join(inst, "var/lib/dpkg/status"), nil, 0o644)
	if out, err := exec.Command("dpkg", "--root="+inst, "--admindir="+filepath.Join(inst, "var/lib/dpkg"), "--force-depends",
		"--force-script-chrootless", "--log=/dev/null", "-i", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i: %v\n%s", err, out)
	}
	if out := testutil.Run(t, filepath.Join(inst, "usr/bin/vmnetctl"), "version"); !strings.Contains(out, "version: v1.2.3") {
		t.Errorf("the installed vmnetctl version:\n%s", out)
	}

	// The .rpm is an RPM (its lead's magic).
	b, err := os.ReadFile(rpm)
	if err != nil || len(b) < 4 || !bytes.Equal(b[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Errorf("%s is not an RPM package", rpm)
	}
}

// packaged are the files both packages hold (the zsh completion aside);
// completions must not be empty.
var packaged = []string{"/usr/bin/vmnetctl", "/usr/bin/vmnetctl-relay", "/usr/bin/vmnetctl-helper", "/etc/vmnetctl/networks.yaml", "/usr/lib/systemd/system/vmnetctl.service",
	"/usr/share/doc/vmnetctl/docs/security.md", "/usr/share/man/man8/vmnetctl.8.gz", "/usr/share/man/man8/vmnetctl-doctor.8.gz",
	"/usr/share/bash-completion/completions/vmnetctl", "/usr/share/fish/vendor_completions.d/vmnetctl.fish"}

func checkContents(t *testing.T, format string, files map[string]int64, zsh, license string) {
	t.Helper()
	for _, f := range append(packaged, zsh, license) {
		size, ok := files[f]
		switch {
		case !ok:
			t.Errorf("the .%s lacks %s:\n%v", format, f, files)
		case size == 0 && (strings.Contains(f, "completion") || f == zsh || f == license):
			t.Errorf("the .%s's %s is empty", format, f)
		}
	}
	for f := range files {
		if strings.HasPrefix(f, "/usr/share/man/") && !strings.HasSuffix(f, ".gz") {
			t.Errorf("the .%s's man page %s is not compressed", format, f)
		}
	}
}

// debContents lists a .deb's regular files and their sizes (dpkg-deb -c).
func debContents(t *testing.T, deb string) map[string]int64 {
	files := map[string]int64{}
	for _, l := range strings.Split(testutil.Run(t, "dpkg-deb", "-c", deb), "\n") {
		// -rw-r--r-- root/root 1234 2026-01-01 00:00 ./usr/bin/vmnetctl
		f := strings.Fields(l)
		if len(f) >= 6 && strings.HasPrefix(f[0], "-") {
			size, _ := strconv.ParseInt(f[2], 10, 64)
			files[strings.TrimPrefix(f[5], ".")] = size
		}
	}
	return files
}

// rpmContents lists an .rpm's files and their sizes (rpm -qlp --dump).
func rpmContents(t *testing.T, rpm string) map[string]int64 {
	files := map[string]int64{}
	for _, l := range strings.Split(testutil.Run(t, "rpm", "-qlp", "--dump", rpm), "\n") {
		// PATH SIZE MTIME DIGEST MODE OWNER GROUP ISCONFIG ISDOC RDEV SYMLINK
		if f := strings.Fields(l); len(f) >= 2 {
			size, _ := strconv.ParseInt(f[1], 10, 64)
			files[f[0]] = size
		}
	}
	return files
}

// unitKeys are a unit file's KEY=VALUE settings (the last of each key).
func unitKeys(unit string) map[string]string {
	keys := map[string]string{}
	for _, l := range strings.Split(unit, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(k, "#") {
			keys[k] = v
		}
	}
	return keys
}

// treeStamps says whether each path exists and when it last changed.
func treeStamps(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s %s; ", p, fi.ModTime())
		} else {
			fmt.Fprintf(&b, "%s absent; ", p)
		}
	}
	return b.String()
}
