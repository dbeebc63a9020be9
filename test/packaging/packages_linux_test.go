// Package packaging builds the .deb and .rpm (`make packages`) and checks
// what a user installs: the binary runs, the default networks.yaml is a
// config file that loads, the systemd unit starts the controller as a
// service, and nftables is a dependency.
package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
	dist := t.TempDir()
	cmd := exec.Command("make", "-C", root, "packages")
	cmd.Env = append(os.Environ(), "PKG_VERSION=1.2.3", "DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make packages: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "vmnetctl_1.2.3_*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(dist, "vmnetctl-1.2.3-1.*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("packages in %s: %v %v", dist, debs, rpms)
	}
	deb := debs[0]

	files := testutil.Run(t, "dpkg-deb", "-c", deb)
	for _, f := range []string{"./usr/bin/vmnetctl", "./etc/vmnetctl/networks.yaml", "./usr/lib/systemd/system/vmnetctl.service",
		"./usr/share/doc/vmnetctl/docs/security.md", "./usr/share/man/man8/vmnetctl.8", "./usr/share/man/man8/vmnetctl-doctor.8",
		"./usr/share/bash-completion/completions/vmnetctl", "./usr/share/zsh/vendor-completions/_vmnetctl",
		"./usr/share/fish/vendor_completions.d/vmnetctl.fish"} {
		if !strings.Contains(files, f) {
			t.Errorf("the .deb lacks %s:\n%s", f, files)
		}
	}
	if dep := testutil.Run(t, "dpkg-deb", "-f", deb, "Depends"); !strings.Contains(dep, "nftables") {
		t.Errorf("Depends: %q, want nftables", dep)
	}
	control := t.TempDir()
	testutil.Run(t, "dpkg-deb", "-e", deb, control)
	if b, _ := os.ReadFile(filepath.Join(control, "conffiles")); !strings.Contains(string(b), "/etc/vmnetctl/networks.yaml") {
		t.Errorf("conffiles %q: networks.yaml is not a config file (an edited one would be overwritten on upgrade)", b)
	}
	if b, _ := os.ReadFile(filepath.Join(control, "postinst")); !strings.Contains(string(b), "enable --now vmnetctl.service") {
		t.Errorf("postinst does not start the service:\n%s", b)
	}

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
	execStart := ""
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			execStart = v
		}
	}
	argv := strings.Fields(execStart)
	if len(argv) < 2 || argv[0] != "/usr/bin/vmnetctl" || !strings.Contains(string(unit), "Restart=on-failure") {
		t.Fatalf("unit: ExecStart=%q, want /usr/bin/vmnetctl ..., and Restart=on-failure:\n%s", execStart, unit)
	}
	// The unit's flags are the binary's: --help parses them without running.
	if out, err := exec.Command(bin, append(argv[1:], "--help")...).CombinedOutput(); err != nil || !strings.Contains(string(out), "--exit-when-idle") {
		t.Errorf("%s --help: %v\n%s", execStart, err, out)
	}
	if p, err := exec.LookPath("systemd-analyze"); err == nil {
		// The binary is not installed at /usr/bin here: that is the one
		// complaint allowed.
		out, _ := exec.Command(p, "verify", "--man=no", filepath.Join(tree, "usr/lib/systemd/system/vmnetctl.service")).CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "vmnetctl.service") && !strings.Contains(l, "/usr/bin/vmnetctl is not executable") {
				t.Errorf("systemd-analyze verify: %s", l)
			}
		}
	}

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
	b, err := os.ReadFile(rpms[0])
	if err != nil || len(b) < 4 || !bytes.Equal(b[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Errorf("%s is not an RPM package", rpms[0])
	}
}
