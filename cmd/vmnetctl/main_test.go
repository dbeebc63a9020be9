package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// runCLI runs vmnetctl with args and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIWithNetworks(t, "", args...)
}

// runCLIWithNetworks is runCLI with $VMNETCTL_NETWORKS set to networks:
// for the commands that take no --networks but read networks.yaml.
func runCLIWithNetworks(t *testing.T, networks string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv("VMNETCTL_NETWORKS", networks)
	var out, errOut bytes.Buffer
	code = run(args, streams{in: strings.NewReader(""), out: &out, err: &errOut})
	return code, out.String(), errOut.String()
}

func TestNetworksJSONGolden(t *testing.T) {
	for _, tt := range []struct{ golden, networks string }{
		{"networks-embedded.json", ""},
		{"networks-lima.json", "../../examples/lima-networks.yaml"},
		{"networks-vmnet.json", "../../examples/vmnet-networks.yaml"},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			args := []string{"networks", "--json"}
			if tt.networks != "" {
				args = append(args, "--networks", tt.networks)
			}
			code, out, errOut := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			testutil.Golden(t, filepath.Join("testdata", tt.golden), out)
		})
	}
}

func TestNetworksTable(t *testing.T) {
	code, out, _ := runCLI(t, "networks", "--networks", "../../examples/lima-networks.yaml")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	testutil.Golden(t, "testdata/networks-lima.txt", out)
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string // substrings
		stderr   []string
		noStdout bool
	}{
		{name: "a lima instance file with - vmnet: shared",
			args:   []string{"validate", "-f", "../../examples/default/lima.yaml"},
			stdout: []string{"examples/default/lima.yaml: 1 VM, valid", "default  shared   52:09:05:a7:d7:99", "skipping entry 3 (socket)"}},
		{name: "lima's networks.yaml",
			args:   []string{"validate", "--networks", "../../examples/lima-networks.yaml"},
			stdout: []string{"lima-networks.yaml: 4 networks, valid"}},
		{name: "a broken file: every error, exit 1, nothing on stdout",
			args: []string{"validate", "-f", "../../examples/broken/vms.yaml"}, code: 1, noStdout: true,
			stderr: []string{
				`examples/broken/vms.yaml:5: vms.web.networks[0].vmnet: network "shraed" is not defined`,
				`examples/broken/vms.yaml:7: vms.web.networks[1].ip:`,
				`examples/broken/vms.yaml:11: vms.db.networks[0].macAdress: unknown field (did you mean "macAddress"?)`,
				`examples/broken/vms.yaml:12: vms.bad name;rm -rf: VM name`,
				"4 errors found"}},
		{name: "a broken networks.yaml and a VM file: both reported",
			args: []string{"validate", "--networks", "testdata/broken-networks.yaml", "-f", "../../examples/broken/vms.yaml"}, code: 1, noStdout: true,
			stderr: []string{"testdata/broken-networks.yaml:4: networks.shared.gateway:", "vms.db.networks[0].macAdress"}},
		{name: "the vmnet-helper backend's limits are warnings",
			args:   []string{"validate", "--backend", "vmnet-helper", "--networks", "../../examples/vmnet-networks.yaml"},
			stdout: []string{"4 networks, valid"},
			stderr: []string{"warning: network jumbo (vmnet-helper): mtu: 9000 cannot be honoured on macOS",
				"warning: network shared (vmnet-helper): reservations: 1 reservation cannot be honoured"}},
		{name: "a tap attachment on the vmnet-helper backend: an error, exit 1",
			args: []string{"validate", "--backend", "vmnet-helper", "-f", "../../examples/vms.yaml"}, code: 1, noStdout: true,
			stderr: []string{"error: firecracker/0 (vmnet-helper): will not start: attach: tap needs Linux",
				"warning: web/0 (vmnet-helper): ip: 192.168.105.10 cannot be honoured", "1 setting the vmnet-helper backend would refuse"}},
		{name: "a socket path over 107 bytes is an error at validate",
			args: []string{"--state-dir", "/tmp/" + strings.Repeat("x", 100), "validate", "-f", "../../examples/vms.yaml"}, code: 1, noStdout: true,
			stderr: []string{"examples/vms.yaml:9: VM db: its helper's socket", "over the 107 a unix socket path can hold", "3 errors found"}},
		{name: "a missing file",
			args: []string{"validate", "-f", "nope.yaml"}, code: 1, noStdout: true,
			stderr: []string{"nope.yaml: no such file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errOut)
			}
			if tt.noStdout && out != "" {
				t.Errorf("stdout is not empty:\n%s", out)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "version: v") || !strings.Contains(out, "\ncommit: ") {
		t.Errorf("version printed %q (exit %d), want vmnet-helper's version: and commit: lines", out, code)
	}
	if code, out, _ := runCLI(t, "--version"); code != 0 || out != "vmnetctl version "+version+"\n" {
		t.Errorf("--version printed %q (exit %d), want \"vmnetctl version %s\"", out, code, version)
	}
}

// No flag's help names its argument with a backquoted word: pflag takes
// the first `word` of a usage string as the argument's name (--fds
// vmnetctl run).
func TestFlagHelpHasNoBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: its help shows %q as the argument: %q", c.CommandPath(), f.Name, name, f.Usage)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand(streams{}))
	if _, out, _ := runCLI(t, "args", "--help"); !strings.Contains(out, "--fds ") || strings.Contains(out, "--fds vmnetctl") {
		t.Errorf("args --help:\n%s", out)
	}
}

// network create completes every network vmnetctl runs of networks.yaml,
// with nothing up: an empty state dir.
func TestCompleteNetworkCreate(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "host\nshared\n:"},
		{[]string{"--networks", "../../examples/lima-networks.yaml"}, "bridged\nhost\nshared\n:"},
	} {
		_, out, _ := runCLI(t, append(append([]string{"--state-dir", dir}, tc.args...), "__complete", "network", "create", "")...)
		if !strings.HasPrefix(out, tc.want) {
			t.Errorf("completion of network create %v: %q, want %q", tc.args, out, tc.want)
		}
	}
}

// Help shows a global flag only where it acts.
func TestHelpShowsFlagsWhereTheyAct(t *testing.T) {
	for _, tc := range []struct {
		cmd        []string
		has, lacks []string
	}{
		{[]string{"up", "--help"}, []string{"--networks", "--state-dir"}, nil},
		{[]string{"status", "--help"}, []string{"--state-dir"}, []string{"--networks"}},
		{[]string{"network", "create", "--help"}, []string{"--networks", "--state-dir"}, nil},
		{[]string{"network", "delete", "--help"}, []string{"--state-dir", "--json"}, []string{"--networks"}},
		{[]string{"completion", "bash", "--help"}, []string{"--state-dir"}, []string{"--networks"}},
		{[]string{"version", "--help"}, nil, []string{"--networks", "--state-dir"}},
		{[]string{"doctor", "--help"}, []string{"--networks", "--state-dir"}, nil},
		{[]string{"helper", "--help"}, []string{"--networks", "--state-dir"}, nil},
	} {
		_, out, _ := runCLI(t, tc.cmd...)
		for _, f := range tc.has {
			if !strings.Contains(out, f) {
				t.Errorf("%v: help lacks %s:\n%s", tc.cmd, f, out)
			}
		}
		for _, f := range tc.lacks {
			if strings.Contains(out, f) {
				t.Errorf("%v: help shows %s, which does not act there:\n%s", tc.cmd, f, out)
			}
		}
	}
}

// The README's commands that need neither root nor a user's own files run
// here, as the README shows them: its examples cannot rot.
func TestREADMECommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, line := range strings.Split(string(readme), "\n") {
		cmdline, _, _ := strings.Cut(line, "#")
		args := strings.Fields(cmdline)
		if len(args) < 2 || args[0] != "bin/vmnetctl" || strings.Contains(cmdline, "~") {
			continue
		}
		// Paths in the README are the repository's; the test runs in cmd/vmnetctl.
		for i, a := range args {
			if strings.HasPrefix(a, "examples/") {
				args[i] = "../../" + a
			}
		}
		want := 0
		if strings.Contains(cmdline, "broken") {
			want = 1 // the example of every mistake
		}
		if code, out, errOut := runCLI(t, args[1:]...); code != want {
			t.Errorf("README: %s: exit %d, want %d\n%s%s", strings.TrimSpace(cmdline), code, want, out, errOut)
		}
		ran++
	}
	if ran < 2 {
		t.Fatalf("ran %d README commands: the README's demo block moved?", ran)
	}
}

// Every command and subcommand has an Examples section.
func TestEveryCommandHasExamples(t *testing.T) {
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" {
				continue
			}
			if sub.Example == "" {
				t.Errorf("%s has no Examples", sub.CommandPath())
			}
			seen[sub.CommandPath()] = true
			walk(sub)
		}
	}
	walk(newRootCommand(streams{}))
	for _, c := range []string{"vmnetctl completion", "vmnetctl completion bash", "vmnetctl network delete"} {
		if !seen[c] {
			t.Errorf("no command %s", c)
		}
	}
}
