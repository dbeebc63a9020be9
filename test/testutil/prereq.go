package testutil

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// InCI reports whether the tests run in CI: the environment variable CI is
// true (as CI services and .ci/run set it).
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Missing reports that a prerequisite of the test is missing: what is
// missing, and install, how to get it. With CI=true it fails the test, since
// CI's machine is set up to have everything (test/setup.sh); elsewhere it
// skips the test.
func Missing(tb testing.TB, what, install string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("missing prerequisite: %s; %s (CI=true: a missing prerequisite fails the test instead of skipping it)", what, install)
	}
	tb.Skipf("skipped, missing prerequisite: %s; %s (with CI=true this fails)", what, install)
}

// RequireRoot skips (or with CI=true fails) the test unless it runs as root.
// why says what needs root.
func RequireRoot(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "root ("+why+")", "run the tests as root: sudo go test, or sudo make test")
	}
}

// setupInstalls maps a command the tests run to the Debian package that
// provides it; test/setup.sh installs them all.
var setupInstalls = map[string]string{
	"ip":                 "iproute2",
	"nft":                "nftables",
	"pkill":              "procps",
	"pgrep":              "procps",
	"ss":                 "iproute2",
	"busybox":            "busybox-static",
	"/usr/bin/busybox":   "busybox-static",
	"ping":               "iputils-ping",
	"iperf3":             "iperf3",
	"socat":              "socat",
	"prometheus":         "prometheus",
	"promtool":           "prometheus",
	"qemu-system-x86_64": "qemu-system-x86",
	"cpio":               "cpio",
	"slirp4netns":        "slirp4netns",
	"setpriv":            "util-linux",
}

// InstallHint says how to get command: the Debian package test/setup.sh
// installs for it.
func InstallHint(command string) string {
	if pkg, ok := setupInstalls[command]; ok {
		return "install the Debian package " + pkg + " (test/setup.sh, run as root, installs it)"
	}
	return "put it on PATH"
}

// RequireCommands skips (or with CI=true fails) the test unless every
// command is found on PATH (or, for a path, exists).
func RequireCommands(tb testing.TB, commands ...string) {
	tb.Helper()
	for _, c := range commands {
		if _, err := exec.LookPath(c); err != nil {
			Missing(tb, c, InstallHint(c))
		}
	}
}
