// Package vmnethelpersuite runs vmnet-helper's own test suite against
// `vmnetctl helper`: the drop-in promise, checked by the other project's
// tests rather than ours.
package vmnethelpersuite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// EnvSuite names a checkout of vmnet-helper (github.com/nirs/vmnet-helper)
// whose testing/helper_test.py the test runs instead of the copy in
// vmnet-helper/ (README.md there says which commit it is); EnvPythonPath
// is a PYTHONPATH under which python3 imports pytest and scapy, if none
// of the python3s found does (test/setup.sh installs Debian's).
const (
	EnvSuite      = "VMNETCTL_VMNET_HELPER_SUITE"
	EnvPythonPath = "VMNETCTL_VMNET_HELPER_PYTHONPATH"
)

// conftest adapts the suite's probes of macOS to Linux, without changing
// a test: the macOS version it reads at import (26: no sudo, and the
// tests of named networks run) and vmnet-broker's launchd file (vmnetctl's
// helper has named networks of its own, from networks.yaml).
const conftest = `import os.path
import platform

platform.mac_ver = lambda: ("26.0", ("", "", ""), "")
_exists = os.path.exists
os.path.exists = lambda p: p == "/Library/LaunchDaemons/com.github.nirs.vmnet-broker.plist" or _exists(p)
`

// TestVmnetHelperSuite runs vmnet-helper's testing/helper_test.py, cold,
// against `vmnetctl helper` and wants every test to pass, none skipped.
// It runs in namespaces of its own: "host", where the suite starts the
// helper as /opt/vmnet-helper/bin/vmnet-helper (a shim in a private mount
// namespace: the host's /opt is untouched) with a state dir of the test's,
// and "wan", the suite's internet: 1.1.1.1 and 8.8.8.8, which its NAT
// tests ping, answer there and nowhere else.
func TestVmnetHelperSuite(t *testing.T) {
	suite := os.Getenv(EnvSuite)
	if suite == "" {
		suite = "vmnet-helper"
	}
	testutil.RequireRoot(t, "runs the suite in network namespaces")
	testutil.RequireCommands(t, "unshare", "ip")
	pythonPath := os.Getenv(EnvPythonPath)
	python := findPython(pythonPath)
	if python == "" {
		testutil.Missing(t, "python3 with pytest and scapy", "test/setup.sh installs python3-pytest and python3-scapy")
	}
	dir := t.TempDir()
	// A copy of the suite with the conftest beside it: the checkout is
	// left as it is.
	if err := os.CopyFS(filepath.Join(dir, "suite", "testing"), os.DirFS(filepath.Join(suite, "testing"))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "suite", "conftest.py"), []byte(conftest), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := testutil.BuildVmnetctl(dir)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")

	host, wan := testutil.NewNS(t, "vhs"), testutil.NewNS(t, "vhs-wan")
	testutil.Run(t, "ip", "link", "add", "uplink", "netns", host.Name, "type", "veth", "peer", "name", "wan0", "netns", wan.Name)
	host.MustRun(t, "ip", "addr", "add", "10.99.0.1/30", "dev", "uplink")
	host.MustRun(t, "ip", "link", "set", "uplink", "up")
	host.MustRun(t, "ip", "route", "add", "default", "via", "10.99.0.2")
	wan.MustRun(t, "ip", "addr", "add", "10.99.0.2/30", "dev", "wan0")
	wan.MustRun(t, "ip", "link", "set", "wan0", "up")
	for _, a := range []string{"1.1.1.1/32", "8.8.8.8/32"} {
		wan.MustRun(t, "ip", "addr", "add", a, "dev", "lo")
	}
	t.Cleanup(func() { host.Run(context.Background(), bin, "--state-dir", state, "down", "--all") })

	script := fmt.Sprintf(`set -e
mount -t tmpfs none /opt
mkdir -p /opt/vmnet-helper/bin
printf '#!/bin/sh\nexec %[1]s --state-dir %[2]s helper "$@"\n' > /opt/vmnet-helper/bin/vmnet-helper
chmod +x /opt/vmnet-helper/bin/vmnet-helper
cd %[3]s
exec %[4]s -m pytest -q -p no:cacheprovider -rs testing/helper_test.py`, bin, state, filepath.Join(dir, "suite"), python)
	cmd := host.Command(context.Background(), "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPath, "HOME="+dir)
	out, err := cmd.CombinedOutput()
	// pytest's last line: "27 passed in 20.80s" (or "N failed, M passed ...").
	summary := regexp.MustCompile(`(?m)^(?:=+ )?((?:[0-9]+ [a-z]+(?:, )?)+) in [0-9.]+s(?: =+)?$`).FindStringSubmatch(string(out))
	t.Logf("vmnet-helper's suite: %v", summary)
	if err != nil || summary == nil || strings.Contains(summary[1], "failed") || strings.Contains(summary[1], "skipped") {
		ctl, _ := os.ReadFile(filepath.Join(state, "controller.log"))
		t.Fatalf("vmnet-helper's suite against vmnetctl helper: %v\n%s\nthe controller's log, last lines:\n%s", err, tail(out, 80), tail(ctl, 40))
	}
}

// findPython is the first python3 that imports pytest and scapy, with
// pythonPath as its PYTHONPATH: Debian's (what test/setup.sh installs
// them for), then the one on PATH; "" if none does.
func findPython(pythonPath string) string {
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		probe := exec.Command(py, "-c", "import pytest, scapy.all")
		probe.Env = append(os.Environ(), "PYTHONPATH="+pythonPath)
		if probe.Run() == nil {
			return py
		}
	}
	return ""
}

// tail is the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
