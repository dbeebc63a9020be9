package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The messages of issue 36 ("Every mistake at once, and a CLI that never
// leaves the user guessing"), each compared whole with a golden file under
// testdata/ (go test -update rewrites them), as a user sees them: the
// command line run in process, its exit status, stdout and stderr.

// TestValidateEveryMistake: one networks.yaml with an unknown mode, a
// gateway and a netmask that are none, and four more independent mistakes,
// and one VM file whose VM with an invalid name has a bad MAC on the next
// line, among others: validate reports all 13 in one run, each at its
// FILE:LINE with the path as given, exits 1 and prints nothing on stdout;
// --json gives the same 13 problems as objects.
func TestValidateEveryMistake(t *testing.T) {
	args := []string{"validate", "--networks", "testdata/every-mistake/networks.yaml", "-f", "testdata/every-mistake/vms.yaml"}
	code, out, errOut := runCLI(t, args...)
	if code != 1 || out != "" {
		t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
	}
	if !strings.HasSuffix(errOut, "\n13 errors found\n") {
		t.Errorf("stderr does not end in 13 errors found:\n%s", errOut)
	}
	testutil.Golden(t, "testdata/validate-every-mistake.txt", errOut)

	code, out, errOut = runCLI(t, append(args, "--json")...)
	if code != 1 || errOut != "" {
		t.Errorf("--json: exit %d, stderr %q; want 1 and nothing", code, errOut)
	}
	var r struct {
		Valid    bool              `json:"valid"`
		Problems []json.RawMessage `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Valid || len(r.Problems) != 13 {
		t.Errorf("--json: valid %v, %d problems (%v); want 13 problems", r.Valid, len(r.Problems), err)
	}
	testutil.Golden(t, "testdata/validate-every-mistake.json", out)
}

// entry is a network or VM of a generated file with independent mistakes
// in it: the lines it takes (indented under its name) and which of them
// are wrong.
type entry struct {
	lines []string
	at    []int // the indexes in lines of the wrong ones; -1: the name's line
}

// networkEntries make the i-th network of a networks.yaml, each wrong in
// its own way; every network has addresses of its own, so no two collide.
var networkEntries = []func(i int) entry{
	func(i int) entry { // issue 36's three at once
		return entry{lines: []string{"mode: hostt", "gateway: " + tenNet(i) + ".300", "netmask: 255.0.255.0"}, at: []int{0, 1, 2}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: hostt", "subnet: " + tenNet(i) + ".0/24"}, at: []int{0}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: host", "gateway: " + tenNet(i) + ".300"}, at: []int{1}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: host", "gateway: " + tenNet(i) + ".1", "netmask: 255.0.255.0"}, at: []int{2}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: host", "subnet: " + tenNet(i) + ".0/24", "mtu: 10"}, at: []int{2}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: shared", "subnet: " + tenNet(i) + ".0/24", "dhcp: maybe"}, at: []int{2}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: host", "subnet: " + tenNet(i) + ".0/24", "dhcpend: " + tenNet(i) + ".9"}, at: []int{2}}
	},
	func(i int) entry {
		return entry{lines: []string{"mode: host", fmt.Sprintf("subnet: 8.8.%d.0/24", i%250)}, at: []int{1}}
	},
	func(int) entry { return entry{lines: []string{"mode: bridged", "interface: lo"}, at: []int{1}} },
}

// tenNet is the first three octets of network i's own /24 in 10.0.0.0/8.
func tenNet(i int) string { return fmt.Sprintf("10.%d.%d", i/250, i%250) }

// vmEntries are the VMs of a VM file, each wrong in its own way: its
// name, or its one network entry (under networks:, as a list item).
var vmEntries = []entry{
	{lines: []string{"- vmnet: shared", "  macAddress: nope"}, at: []int{-1, 1}}, // issue 36's: a bad name hides no bad MAC
	{lines: []string{"- vmnet: shared"}, at: []int{-1}},
	{lines: []string{"- vmnet: shared", "  macAddress: nope"}, at: []int{1}},
	{lines: []string{"- vmnet: host", "  macAdress: 52:55:55:00:00:01"}, at: []int{1}},
	{lines: []string{"- vmnet: shared", "  attach: bogus"}, at: []int{1}},
	{lines: []string{"- vmnet: host", "  ip: 300.1.1.1"}, at: []int{1}},
	{lines: []string{"- vmnet: shared", "  metric: x"}, at: []int{1}},
	{lines: []string{"- vmnet: shraed"}, at: []int{0}},
}

// writeMistakes writes a networks.yaml (kind "networks") or a VM file
// (kind "vms") of n entries, the kinds in turn, to path and returns the
// "FILE:LINE" of each mistake.
func writeMistakes(t *testing.T, path, kind string, n int) []string {
	t.Helper()
	lines := []string{"vmnet:"}
	if kind == "vms" {
		lines = []string{"vms:"}
	}
	var at []string
	for i := range n {
		var e entry
		name := fmt.Sprintf("n%d", i)
		if kind == "vms" {
			e = vmEntries[i%len(vmEntries)]
			name = fmt.Sprintf("vm%d", i)
			if slices.Contains(e.at, -1) {
				name = fmt.Sprintf("vm.%d", i) // a dot: no VM name
			}
		} else {
			e = networkEntries[i%len(networkEntries)](i)
		}
		lines = append(lines, "  "+name+":")
		if slices.Contains(e.at, -1) {
			at = append(at, fmt.Sprintf("%s:%d", path, len(lines)))
		}
		if kind == "vms" {
			lines = append(lines, "    networks:")
		}
		for j, l := range e.lines {
			lines = append(lines, "    "+l)
			if slices.Contains(e.at, j) {
				at = append(at, fmt.Sprintf("%s:%d", path, len(lines)))
			}
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return at
}

// TestValidateReportsN: a file with N independent mistakes reports N, for
// several N: a networks.yaml, a VM file, and both at once (the VM file's
// entries then resolved against the networks of the broken networks.yaml
// that load: an error in one network hides only what depends on it),
// each mistake at its line, past the 100 errors validate prints too
// (api.MaxShown; "... and N more"). The files are made here, of entries
// with one mistake or several (issue 36's) in turn.
func TestValidateReportsN(t *testing.T) {
	for _, entries := range []int{1, 2, 9, 23, 110} {
		for _, kind := range []string{"networks", "vms", "both"} {
			dir := t.TempDir()
			args := []string{"validate", "--networks", "../../config/networks.yaml"} // the built-in networks
			var want []string
			if kind != "vms" {
				args[2] = filepath.Join(dir, "networks.yaml")
				want = writeMistakes(t, args[2], "networks", entries)
				// The networks the VM files name, without a mistake.
				f, err := os.OpenFile(args[2], os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprint(f, "  shared:\n    subnet: 192.168.105.0/24\n  host:\n    mode: host\n    subnet: 192.168.106.0/24\n")
				f.Close()
			}
			if kind != "networks" {
				path := filepath.Join(dir, "vms.yaml")
				want = append(want, writeMistakes(t, path, "vms", entries)...)
				args = append(args, "-f", path)
			}
			t.Run(fmt.Sprintf("%s-%d", kind, len(want)), func(t *testing.T) { checkReported(t, args, want) })
		}
	}
}

// checkReported runs validate with args, text and --json, and checks that
// it reports exactly the problems at want (each "FILE:LINE"), once each.
func checkReported(t *testing.T, args, want []string) {
	t.Helper()
	n := len(want)
	code, out, errOut := runCLI(t, args...)
	if code != 1 || out != "" {
		t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	shown := min(n, api.MaxShown)
	tail := []string{fmt.Sprintf("%d error%s found", n, plural(n))}
	if n > shown {
		tail = append([]string{fmt.Sprintf("... and %d more", n-shown)}, tail...)
	}
	if len(lines) != shown+len(tail) || !slices.Equal(lines[len(lines)-len(tail):], tail) {
		t.Fatalf("%d lines, want %d problems then %q:\n%s", len(lines), shown, tail, errOut)
	}
	for i, l := range lines[:shown] {
		if !strings.HasPrefix(l, want[i]+": ") {
			t.Errorf("line %d: %q, want the problem at %s", i+1, l, want[i])
		}
	}

	code, out, _ = runCLI(t, append(args, "--json")...)
	var r struct {
		Problems []struct {
			File     string `json:"file"`
			Line     int    `json:"line"`
			Severity string `json:"severity"`
		} `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 1 {
		t.Fatalf("--json: exit %d, %v", code, err)
	}
	var got []string
	for _, p := range r.Problems {
		if p.Severity == "error" {
			got = append(got, fmt.Sprintf("%s:%d", p.File, p.Line))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("--json: %d errors at %v\nwant %d at %v", len(got), got, n, want)
	}
}

// TestCLIFailsClearly: a missing object is an error, with exit status 1,
// that says what is missing and what there is: `network delete nosuch`
// names the networks there are (not "not kept", exit 0); `down` with
// nothing named mentions --all and what is up; a VM that is not up lists
// the VMs that are, each once (not "[fc web web]").
func TestCLIFailsClearly(t *testing.T) {
	up := upState(t)
	for _, tc := range []struct {
		golden, networks string
		args             []string
		state            statedir.Dir
	}{
		{golden: "network-delete-nosuch.txt", networks: "../../examples/lima-networks.yaml", args: []string{"network", "delete", "nosuch"}},
		{golden: "down-nothing-up.txt", args: []string{"down"}},
		{golden: "down-projects-up.txt", args: []string{"down"}, state: up},
		{golden: "logs-vm-not-up.txt", args: []string{"logs", "nosuch"}, state: up},
		{golden: "describe-vm-not-up.txt", args: []string{"describe", "nosuch"}, state: up},
		{golden: "args-vm-not-up.txt", args: []string{"args", "nosuch"}, state: up},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			if tc.state.Path == "" {
				tc.state = statedir.Dir{Path: t.TempDir()}
			}
			code, out, errOut := runCLIWithNetworks(t, tc.networks, append([]string{"--state-dir", tc.state.Path}, tc.args...)...)
			if code != 1 || out != "" {
				t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
			}
			testutil.Golden(t, filepath.Join("testdata", tc.golden), strings.ReplaceAll(errOut, tc.state.Path, "$STATE_DIR"))
		})
	}
}

// upVMs is the VM file of upState: web with two attachments, fc with one.
const upVMs = `vms:
  web:
    networks:
      - vmnet: shared
      - vmnet: host
  fc:
    networks:
      - vmnet: shared
        attach: tap
`

// upState is a state dir whose runtime record says two projects are up,
// "vms" (VMs web and fc of upVMs, on the built-in networks) and "db" (no
// VM), with no controller and no helper running: what the commands that
// read the state dir need, without root.
func upState(t *testing.T) statedir.Dir {
	t.Helper()
	sd := statedir.Dir{Path: t.TempDir()}
	vms := &statedir.Project{Name: "vms", Files: []statedir.ProjectFile{{Path: "vms.yaml", Abs: "/home/u/vms.yaml", Data: []byte(upVMs)}}}
	db := &statedir.Project{Name: "db"}
	for _, p := range []*statedir.Project{vms, db} {
		if err := sd.SaveProject(p); err != nil {
			t.Fatal(err)
		}
	}
	rt := statedir.Runtime{
		AppliedNetworks: &statedir.NetworksSnapshot{Source: config.EmbeddedSource, Data: config.DefaultNetworks},
		AppliedProjects: []*statedir.Project{vms, db},
	}
	if err := sd.SaveRuntime(rt); err != nil {
		t.Fatal(err)
	}
	return sd
}

// TestJSONEverywhere: validate, version and args take --json and print
// JSON of their documented shapes: validate's of valid files, version's
// (its values, which depend on the build, checked, then replaced by
// placeholders), args' of a VM that is up.
func TestJSONEverywhere(t *testing.T) {
	up := upState(t)
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"validate.json", []string{"validate", "--networks", "../../config/networks.yaml", "-f", "../../examples/default/lima.yaml", "--json"}},
		{"version.json", []string{"version", "--json"}},
		{"args.json", []string{"--state-dir", up.Path, "args", "web", "--fds", "--json"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if tc.golden == "version.json" {
				platform := runtime.GOOS + "/" + runtime.GOARCH
				if v["version"] != version || v["commit"] != controller.BuildCommit() || v["platform"] != platform {
					t.Errorf("version --json: %v, want version %s, commit %s, platform %s", v, version, controller.BuildCommit(), platform)
				}
				out = strings.NewReplacer(`"`+version+`"`, `"VERSION"`, `"`+controller.BuildCommit()+`"`, `"COMMIT"`, `"`+platform+`"`, `"PLATFORM"`).Replace(out)
			}
			testutil.Golden(t, filepath.Join("testdata", tc.golden), out)
		})
	}
}

// TestTailAndSince: `events --tail N` prints the last N events, `--since`
// those from a time on (both: the last N of those), `logs --tail N` the
// last N lines of the controller's log; each line with its time.
func TestTailAndSince(t *testing.T) {
	// Events print their times in the local zone: UTC here, whatever the
	// machine's.
	defer func(l *time.Location) { time.Local = l }(time.Local)
	time.Local = time.UTC

	sd := statedir.Dir{Path: t.TempDir()}
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	var events []byte
	for i, ev := range []ctlapi.Event{
		{Kind: "network-up", Network: "shared"},
		{Kind: "helper-started", Network: "shared", Attachment: "web/0", PID: 4242},
		{Kind: "lease-granted", Network: "shared", Attachment: "web/0", MAC: "52:09:05:a7:d7:99", IP: "192.168.105.2"},
		{Kind: "helper-exited", Network: "shared", Attachment: "web/0", PID: 4242, Detail: "exit status 1"},
	} {
		ev.Time = t0.Add(time.Duration(i) * time.Minute)
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		events = append(append(events, b...), '\n')
	}
	if err := os.WriteFile(sd.EventsLog(), events, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(sd.ControllerLog()), 0o755); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	for i, msg := range []string{"controller started", "network up", "helper started", "helper exited"} {
		fmt.Fprintf(&log, "time=%s level=INFO msg=%q\n", t0.Add(time.Duration(i)*time.Minute).Format(time.RFC3339Nano), msg)
	}
	if err := os.WriteFile(sd.ControllerLog(), []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	var all strings.Builder
	for _, args := range [][]string{
		{"events"},
		{"events", "--tail", "2"},
		{"events", "--since", "2026-12-05T08:02:00Z"},
		{"events", "--since", "2026-12-05T08:01:00Z", "--tail", "1"},
		{"logs", "--tail", "2"},
		{"logs", "--since", "2026-12-05T08:02:00Z"},
		{"logs", "--since", "2026-12-05T08:01:00Z", "--tail", "1"},
	} {
		code, out, errOut := runCLI(t, append([]string{"--state-dir", sd.Path}, args...)...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errOut)
		}
		fmt.Fprintf(&all, "$ vmnetctl %s\n%s", strings.Join(args, " "), out)
	}
	code, _, errOut := runCLI(t, "--state-dir", sd.Path, "events", "--since", "yesterday")
	if code != 1 {
		t.Errorf("events --since yesterday: exit %d, want 1", code)
	}
	fmt.Fprintf(&all, "$ vmnetctl events --since yesterday\n%s", errOut)
	testutil.Golden(t, "testdata/tail-and-since.txt", all.String())
}
