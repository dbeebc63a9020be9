package relay

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/helperproto"
)

// envSetCmdline has this test binary, started again, write the command
// line it names (tab-separated) over its own, then print /proc/self/cmdline.
const envSetCmdline = "RELAY_TEST_SET_CMDLINE"

func init() {
	if v, ok := os.LookupEnv(envSetCmdline); ok {
		room, err := cmdlineRoom()
		if err == nil {
			err = setCmdline(room, strings.Split(v, "\t"))
		}
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error())
			os.Exit(0)
		}
		b, _ := os.ReadFile("/proc/self/cmdline")
		os.Stdout.Write(b)
		os.Exit(0)
	}
}

// TestSetCmdline: a process with a spare's room writes a helper's command
// line over its own and /proc shows exactly it, NULs after; one that does
// not fit is refused, and what shows is the process's own.
func TestSetCmdline(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(argv []string) string {
		t.Helper()
		cmd := exec.Command(exe, helperproto.SpareArgs("-test.run=^$", "/run/vmnetctl")[1:]...)
		cmd.Env = append(os.Environ(), envSetCmdline+"="+strings.Join(argv, "\t"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	want := []string{"/usr/bin/vmnetctl", "helper", "--socket", "/run/vmnetctl/vms/a/0.sock"}
	got := run(want)
	if !strings.HasSuffix(got, "\x00") || !slices.Equal(strings.Split(strings.TrimRight(got, "\x00"), "\x00"), want) {
		t.Errorf("/proc/self/cmdline after setCmdline: %q, want %q and NULs", got, want)
	}
	if got := run([]string{strings.Repeat("x", 2*helperproto.SpareRoom)}); !strings.HasPrefix(got, "error: ") {
		t.Errorf("setCmdline of a command line past the room: %q", got)
	}
}

func TestArgArea(t *testing.T) {
	// A command name with spaces and parentheses, as a process may
	// have: fields from the last ')' on.
	fields := []string{"S"}
	for i := 4; i <= 52; i++ {
		fields = append(fields, strconv.Itoa(i))
	}
	odd := "42 (a) b (c)) " + strings.Join(fields, " ") + "\n"
	if start, end, err := argArea([]byte(odd)); err != nil || start != 48 || end != 49 {
		t.Errorf("argArea(%q) = %d, %d, %v; want 48, 49", odd, start, end, err)
	}
	if _, _, err := argArea([]byte("42 (a) S 1 2 3\n")); err == nil {
		t.Error("argArea of a stat without the fields took it")
	}
}
