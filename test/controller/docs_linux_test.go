package controller_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/simvm"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// docsNetworksYAML has the built-in networks' names (the docs' examples
// use them) on subnets of the test's own.
const docsNetworksYAML = `
networks:
  shared:
    mode: shared
    gateway: 10.81.0.1
    dhcpEnd: 10.81.0.254
    netmask: 255.255.255.0
  host:
    mode: host
    gateway: 10.82.0.1
    dhcpEnd: 10.82.0.254
    netmask: 255.255.255.0
`

// docExample is one `$ vmnetctl ...` or `# vmnetctl ...` line of a doc,
// with the output the doc shows under it.
type docExample struct {
	line   int
	args   []string
	exit   int    // "# exit N" in the line's comment; else 0
	output string // the lines under it up to the next prompt or fence
}

// docSkips are the doc lines that cannot run in a namespace, by the start
// of their command, with the reason.
var docSkips = map[string]string{
	"helper --fd 3": "needs the VMM's end of a socketpair inherited as fd 3 (the doc elides it as 3<>...)",
}

var jsonKey = regexp.MustCompile(`"\w+":`)

var exitComment = regexp.MustCompile(`#\s*exit (\d+)`)

// readDocExamples returns the vmnetctl command lines of a doc, and writes
// the files its code blocks name on their first line (`# vms.yaml`) into
// dir.
func readDocExamples(t *testing.T, doc, dir string) []docExample {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docExample
	var cur *docExample
	var file *strings.Builder
	var fileName string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if file != nil {
			if strings.HasPrefix(line, "```") {
				if err := os.WriteFile(filepath.Join(dir, fileName), []byte(file.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				file = nil
				continue
			}
			file.WriteString(line + "\n")
			continue
		}
		if strings.HasPrefix(line, "```yaml") {
			if sc.Scan() {
				n++
				if name, ok := strings.CutPrefix(sc.Text(), "# "); ok && strings.HasSuffix(name, ".yaml") {
					file, fileName = &strings.Builder{}, name
				}
			}
			continue
		}
		cmd, isCmd := strings.CutPrefix(line, "$ ")
		if !isCmd {
			cmd, isCmd = strings.CutPrefix(line, "# ")
		}
		if isCmd || strings.HasPrefix(line, "```") {
			cur = nil
		} else if cur != nil {
			cur.output += line + "\n"
		}
		cmd = strings.TrimPrefix(cmd, "sudo ")
		rest, ok := strings.CutPrefix(cmd, "vmnetctl ")
		if !isCmd || !ok {
			continue
		}
		ex := docExample{line: n}
		if m := exitComment.FindStringSubmatch(rest); m != nil {
			ex.exit, _ = strconv.Atoi(m[1])
		}
		if i := strings.Index(rest, " #"); i >= 0 {
			rest = rest[:i]
		}
		ex.args = strings.Fields(rest)
		out = append(out, ex)
		cur = &out[len(out)-1]
	}
	return out
}

// TestDocExamples runs the vmnetctl command lines of docs/vmms.md,
// docs/controller.md and docs/helper.md, in order, on a host of their own
// per doc, and checks their exit status (0, or the "# exit N" the line
// says) and, for args, the very output the doc shows: the docs' examples
// cannot rot.
func TestDocExamples(t *testing.T) {
	for _, doc := range []string{"vmms.md", "controller.md", "helper.md"} {
		t.Run(doc, func(t *testing.T) {
			h := &host{Host: simvm.NewHost(t, "vmnd", docsNetworksYAML, "pgrep"), t: t}
			examples := readDocExamples(t, filepath.Join("../../docs", doc), h.Dir)
			if len(examples) < 2 {
				t.Fatalf("%s: %d vmnetctl lines: the examples moved?", doc, len(examples))
			}
			ran := 0
			defer func() { t.Logf("%s: ran %d vmnetctl lines", doc, ran) }()
		next:
			for _, ex := range examples {
				ran++
				name := doc + ":" + strconv.Itoa(ex.line) + ": vmnetctl " + strings.Join(ex.args, " ")
				for prefix, why := range docSkips {
					if strings.HasPrefix(strings.Join(ex.args, " "), prefix) {
						t.Logf("%s: skipped: %s", name, why)
						ran--
						continue next
					}
				}
				for i, a := range ex.args {
					if a == "$ID" {
						ex.args[i] = "2835E074-9892-4A79-AFFB-7E41D2605678"
					}
				}
				if ex.args[0] == "helper" {
					runDocHelper(t, h, name, ex)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				cmd := h.VmnetctlCommand(ctx, ex.args...)
				cmd.Dir = h.Dir
				var stdout, stderr strings.Builder
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				cancel()
				code := 0
				if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if code != ex.exit {
					t.Errorf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", name, code, ex.exit, stdout.String(), stderr.String())
				}
				if ex.args[0] == "args" && strings.TrimSpace(ex.output) != "" {
					want := strings.ReplaceAll(ex.output, "/run/vmnetctl", h.StateDir())
					if stdout.String() != want {
						t.Errorf("%s printed\n%s\nthe doc shows\n%s", name, stdout.String(), want)
					}
				}
			}
		})
	}
}

// runDocHelper runs a `vmnetctl helper` line of a doc, which serves until
// stopped: its JSON line must come as the doc shows it, and SIGTERM stop it
// with exit status 0.
func runDocHelper(t *testing.T, h *host, name string, ex docExample) {
	t.Helper()
	cmd := h.VmnetctlCommand(context.Background(), ex.args...)
	cmd.Dir = h.Dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Wait()
		t.Fatalf("%s: no JSON line: %v\n%s", name, err, stderr.String())
	}
	// The doc elides values: the keys it shows must be there.
	keys := jsonKey.FindAllString(ex.output, -1)
	if !strings.HasPrefix(line, "{") || len(keys) == 0 {
		t.Errorf("%s printed %q, the doc shows %q", name, line, ex.output)
	}
	for _, k := range keys {
		if !strings.Contains(line, k) {
			t.Errorf("%s printed %q, without the doc's %s", name, line, k)
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("%s: stopped by SIGTERM: %v\n%s", name, err, stderr.String())
	}
}

// helpExampleOrder is the order in which TestHelpExamples runs the
// commands' Examples (by command path, "" for vmnetctl itself): each line's
// VMs and networks are up when it runs. Every command must be here, so a
// new command's Examples are run too.
var helpExampleOrder = []string{"", "validate", "networks", "version", "doctor", "completion", "completion bash", "completion fish",
	"completion zsh", "completion powershell", "run", "up", "plan", "status", "args", "leases", "describe", "logs", "events", "capture", "impair",
	"network", "network create", "network list", "network inspect", "network delete", "wireguard", "wireguard pubkey", "serve", "helper", "down"}

// helpSkips are the Examples lines that cannot run here, by a substring,
// with the reason.
var helpSkips = map[string]string{
	"doctor":                         "exits 1 on the test host's own problems (doctor's tests set each up in a namespace)",
	"vmnetctl serve":                 "serves until stopped (test/packaging runs it as the unit does)",
	"vmnetctl helper":                "serves until stopped (TestDocExamples runs docs/helper.md's)",
	"qemu-system-x86_64 ...":         "needs qemu and a guest image, which the line elides",
	"/etc/bash_completion.d":         "writes the host's /etc",
	"${fpath[1]}":                    "zsh syntax",
	"Out-String | Invoke-Expression": "PowerShell",
	"wireshark -k -i -":              "needs Wireshark, and a display",
}

// helpSkipped says why line cannot run here, or "".
func helpSkipped(line string) string {
	for s, why := range helpSkips {
		if why != "" && strings.Contains(line, s) {
			return why
		}
	}
	if (strings.Contains(line, "vmnetctl logs") || strings.Contains(line, "vmnetctl events")) && strings.Contains(line, " -f") {
		return "follows until interrupted"
	}
	if strings.Contains(line, "| jq") {
		if _, err := exec.LookPath("jq"); err != nil {
			return "needs jq"
		}
	}
	return ""
}

// helpOf returns the Examples lines and the subcommands of `vmnetctl
// PATH --help`.
func helpOf(t *testing.T, h *host, path string) (examples, subcommands []string) {
	t.Helper()
	out, err := exec.Command(h.Binary, append(strings.Fields(path), "--help")...).Output()
	if err != nil {
		t.Fatalf("vmnetctl %s --help: %v", path, err)
	}
	section := ""
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case l == "":
			section = ""
		case !strings.HasPrefix(l, " "):
			section = l
		case section == "Examples:":
			examples = append(examples, strings.TrimSpace(l))
		case section == "Available Commands:":
			if name := strings.Fields(l)[0]; name != "help" {
				subcommands = append(subcommands, strings.TrimSpace(path+" "+name))
			}
		}
	}
	return examples, subcommands
}

// TestHelpExamples runs the Examples lines of every command's --help (as
// a user would, through a shell, sudo left out) on a host of its own, in
// helpExampleOrder, with the files they name, and checks each exits 0:
// help's examples cannot rot either.
func TestHelpExamples(t *testing.T) {
	testutil.RequireCommands(t, "bash")
	h := &host{Host: simvm.NewHost(t, "vmnx", docsNetworksYAML, "pgrep"), t: t}
	lima, err := os.ReadFile("../../examples/default/lima.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h.WriteFile("vms.yaml", "vms:\n  web:\n    networks:\n      - vmnet: shared\n      - vmnet: host\n")
	h.WriteFile("run.yaml", "vms:\n  b:\n    networks:\n      - vmnet: shared\n")
	h.WriteFile("lima.yaml", string(lima))
	os.MkdirAll(filepath.Join(h.Dir, ".lima/default"), 0o755)
	os.MkdirAll(filepath.Join(h.Dir, ".lima/_config"), 0o755)
	h.WriteFile(".lima/default/lima.yaml", string(lima))
	// The networks.yaml of the lines without --networks
	// ($VMNETCTL_NETWORKS) is the one the lines with it name: lima's, with
	// its user-v2, which the lima instance file uses.
	limaNetworks := h.WriteFile(".lima/_config/networks.yaml", docsNetworksYAML+"  user-v2:\n    mode: user-v2\n    gateway: 10.83.0.1\n    netmask: 255.255.255.0\n")
	os.MkdirAll(filepath.Join(h.Dir, ".config/fish/completions"), 0o755)
	// vmnetctl on PATH is the binary with the host's state dir.
	bin := filepath.Join(h.Dir, "bin")
	os.Mkdir(bin, 0o755)
	h.WriteFile("bin/vmnetctl", "#!/bin/sh\nexec "+h.Binary+" --state-dir "+h.StateDir()+" \"$@\"\n")
	os.Chmod(filepath.Join(bin, "vmnetctl"), 0o755)

	lines := map[string][]string{}
	todo := []string{""}
	for len(todo) > 0 {
		path := todo[0]
		todo = todo[1:]
		ex, subs := helpOf(t, h, path)
		lines[path] = ex
		todo = append(todo, subs...)
		if len(ex) == 0 {
			t.Errorf("vmnetctl %s --help has no Examples", path)
		}
		if !slices.Contains(helpExampleOrder, path) {
			t.Errorf("command %q is not in helpExampleOrder: its Examples would not run", path)
		}
	}
	ran := 0
	for _, path := range helpExampleOrder {
		for _, line := range lines[path] {
			name := "vmnetctl " + path + " --help: " + line
			if why := helpSkipped(line); why != "" {
				t.Logf("%s: skipped: %s", name, why)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			cmd := h.NS.Command(ctx, "bash", "-o", "pipefail", "-c", strings.ReplaceAll(line, "sudo ", ""))
			cmd.Dir = h.Dir
			cmd.Env = append(os.Environ(), h.Env...)
			cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"), "HOME="+h.Dir, "VMNETCTL_NETWORKS="+limaNetworks)
			out, err := cmd.CombinedOutput()
			cancel()
			ran++
			if err != nil {
				t.Errorf("%s: %v\n%s", name, err, out)
			}
		}
	}
	t.Logf("ran %d Examples lines", ran)
	if ran < 30 {
		t.Errorf("ran %d Examples lines: the help moved?", ran)
	}
}
