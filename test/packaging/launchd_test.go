package packaging

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmnetctl/vmnetctl/statedir"
)

// printStateDirEnv makes the test binary print statedir.Default() and exit
// (TestMain): how the test learns the state dir of another user.
const printStateDirEnv = "VMNETCTL_TEST_PRINT_STATEDIR"

func TestMain(m *testing.M) {
	if os.Getenv(printStateDirEnv) == "1" {
		fmt.Print(statedir.Default())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The macOS launch agent runs `vmnetctl serve` as the user who loads it,
// with the state dir that user's `vmnetctl up` uses (statedir.Default of a
// user, under launchd's environment: HOME, no XDG_RUNTIME_DIR), restarts it
// when it fails, leaves the helpers running when it stops, and logs to the
// user's ~/Library/Logs.
func TestLaunchAgent(t *testing.T) {
	b, err := os.ReadFile("../../packaging/com.github.vmnetctl.controller.plist")
	if err != nil {
		t.Fatal(err)
	}
	home := "/Users/alice"
	// As docs/install.md installs it.
	p, err := parsePlist(strings.ReplaceAll(string(b), "@HOME@", home))
	if err != nil {
		t.Fatal(err)
	}
	args, _ := p["ProgramArguments"].([]any)
	if !reflect.DeepEqual(args, []any{"/usr/local/bin/vmnetctl", "serve"}) {
		t.Errorf("ProgramArguments %q, want [/usr/local/bin/vmnetctl serve] (no --state-dir: the user's default, as `vmnetctl up` has it; no --exit-when-idle)", args)
	}
	// A launch agent of the user: no other user, no environment that moves
	// the state dir.
	for _, k := range []string{"UserName", "GroupName", "EnvironmentVariables"} {
		if v, ok := p[k]; ok {
			t.Errorf("%s: %v: the agent must run as its user, with launchd's environment", k, v)
		}
	}
	if p["RunAtLoad"] != true {
		t.Errorf("RunAtLoad %v, want true", p["RunAtLoad"])
	}
	if ka, _ := p["KeepAlive"].(map[string]any); ka == nil || ka["SuccessfulExit"] != false {
		t.Errorf("KeepAlive %v, want {SuccessfulExit: false} (restarted when it fails, as Restart=on-failure)", p["KeepAlive"])
	}
	if p["AbandonProcessGroup"] != true {
		t.Errorf("AbandonProcessGroup %v, want true (helpers left running, as KillMode=process)", p["AbandonProcessGroup"])
	}
	for _, k := range []string{"StandardErrorPath", "StandardOutPath"} {
		if v, _ := p[k].(string); v != home+"/Library/Logs/vmnetctl.log" {
			t.Errorf("%s %q, want %s/Library/Logs/vmnetctl.log", k, v, home)
		}
	}

	// The state dir serve takes there: statedir.Default of a user (not
	// root) whose environment has HOME and no XDG_RUNTIME_DIR.
	if got, want := userStateDir(t, t.TempDir()), "/.local/state/vmnetctl"; !strings.HasSuffix(got, want) || strings.HasPrefix(got, "/run/") {
		t.Errorf("statedir.Default for a user under launchd: %q, want HOME%s", got, want)
	}
}

// userStateDir is statedir.Default() for a user other than root with
// launchd's environment: HOME=home and no XDG_RUNTIME_DIR; as root, the
// test binary, copied where nobody can run it, says it as nobody.
func userStateDir(t *testing.T, home string) string {
	env := []string{"HOME=" + home, printStateDirEnv + "=1"}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if runtime.GOOS != "linux" {
			t.Skip("needs a user other than root")
		}
		dir, err := os.MkdirTemp("", "vmnetctl-statedir")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		os.Chmod(dir, 0o755)
		self = copyExecutable(t, self, filepath.Join(dir, "test"))
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	cmd := exec.Command(self)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("statedir.Default as uid %v: %v", cred, err)
	}
	want := filepath.Join(home, ".local", "state", "vmnetctl")
	if string(out) != want {
		t.Errorf("statedir.Default as a user with HOME=%s: %q, want %q", home, out, want)
	}
	return string(out)
}

func copyExecutable(t *testing.T, from, to string) string {
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return to
}

// parsePlist decodes an XML property list's top dict: dict as
// map[string]any, array as []any, string, true/false as bool, integer as
// int64.
func parsePlist(s string) (map[string]any, error) {
	dec := xml.NewDecoder(strings.NewReader(s))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "dict" {
			v, err := plistValue(dec, se)
			if err != nil {
				return nil, err
			}
			return v.(map[string]any), nil
		}
	}
}

func plistValue(dec *xml.Decoder, se xml.StartElement) (any, error) {
	switch se.Name.Local {
	case "true", "false":
		return se.Name.Local == "true", dec.Skip()
	case "string", "integer", "key":
		var text string
		if err := dec.DecodeElement(&text, &se); err != nil {
			return nil, err
		}
		if se.Name.Local == "integer" {
			return strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		}
		return text, nil
	case "array", "dict":
		var items []any
		for {
			tok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			if _, ok := tok.(xml.EndElement); ok {
				break
			}
			if child, ok := tok.(xml.StartElement); ok {
				v, err := plistValue(dec, child)
				if err != nil {
					return nil, err
				}
				items = append(items, v)
			}
		}
		if se.Name.Local == "array" {
			return items, nil
		}
		m := map[string]any{}
		for i := 0; i+1 < len(items); i += 2 {
			k, ok := items[i].(string)
			if !ok {
				return nil, fmt.Errorf("plist: a dict key %v", items[i])
			}
			m[k] = items[i+1]
		}
		return m, nil
	}
	return nil, fmt.Errorf("plist: unknown element <%s>", se.Name.Local)
}
