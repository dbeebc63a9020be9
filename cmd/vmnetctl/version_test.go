package main

import (
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionOf: a version the build set wins; else the release with the
// commit's first 7 hex digits, as the Makefile writes it; else -dev.
func TestVersionOf(t *testing.T) {
	rev := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "f2eaadc0123456789"}}}
	for _, tc := range []struct {
		set  string
		bi   *debug.BuildInfo
		want string
	}{
		{"v1.2.3", rev, "v1.2.3"},
		{"", rev, "v" + release + "+gitf2eaadc"},
		{"", &debug.BuildInfo{}, "v" + release + "-dev"},
		{"", nil, "v" + release + "-dev"},
	} {
		if got := versionOf(tc.set, tc.bi); got != tc.want {
			t.Errorf("versionOf(%q, %v) = %q, want %q", tc.set, tc.bi, got, tc.want)
		}
	}
}

// TestMakefileVersion: make's version is the one the binary derives, the
// release of version.go with the commit: one version string whoever
// builds (issue 32: make and go build differed).
func TestMakefileVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	if os.Getenv("PKG_VERSION") != "" {
		t.Skip("PKG_VERSION is set: make takes it")
	}
	out, err := exec.Command("make", "-s", "-C", "../..", "--eval", "print-version: ; @echo $(PKG_VERSION)", "print-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	rev, err := exec.Command("git", "rev-parse", "--short=7", "HEAD").Output()
	if err != nil {
		t.Skip("not a git checkout")
	}
	if got, want := strings.TrimSpace(string(out)), release+"+git"+strings.TrimSpace(string(rev)); got != want {
		t.Errorf("make's PKG_VERSION is %q, want %q (versionOf's form)", got, want)
	}
}
