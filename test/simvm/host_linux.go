package simvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// Host is the machine vmnetctl manages, for end-to-end tests: a namespace
// of its own, a state dir and a networks.yaml, and the binary under test.
// When the test ends, no controller or helper of its state dir is left.
type Host struct {
	*testutil.NS
	T        testing.TB
	Dir      string
	Networks string
	Binary   string
	// Env is added to the environment of every vmnetctl command (and so of
	// the controller that `up` starts).
	Env []string
}

// binary is the vmnetctl binary under test, built by Main.
var binary string

// Main is the TestMain of a package whose tests run vmnetctl on a Host: it
// builds the binary, runs the tests and removes the binary.
func Main(m *testing.M) { testutil.MainWithVmnetctl(m, &binary) }

// NewHost makes a host namespace whose networks.yaml holds networksYAML,
// for the binary Main built. It needs root and what every host runs (ip,
// nft, busybox, ping, pkill), and the test's own commands: without them
// the test skips, or fails with CI=true.
func NewHost(t testing.TB, prefix, networksYAML string, commands ...string) *Host {
	t.Helper()
	return NewHostIn(t, "", prefix, networksYAML, commands...)
}

// NewHostIn is NewHost with the host's directory (and state dir) made in
// base ("" for the system's temporary directory): under /run, a state dir
// keeps its projects and leases under /var/lib/vmnetctl, which the test's
// cleanup removes.
func NewHostIn(t testing.TB, base, prefix, networksYAML string, commands ...string) *Host {
	t.Helper()
	testutil.RequireRoot(t, "runs vmnetctl in network namespaces")
	testutil.RequireCommands(t, append([]string{"ip", "nft", "busybox", "ping", "pkill"}, commands...)...)
	if binary == "" {
		t.Fatal("simvm.NewHost: the package's TestMain is not simvm.Main, which builds vmnetctl")
	}
	// Short paths: unix socket paths (in the state dir) are limited to 108 bytes.
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(dir)
		if keep := (statedir.Dir{Path: filepath.Join(dir, "state")}).KeepDir(); keep != filepath.Join(dir, "state") {
			os.RemoveAll(filepath.Dir(keep))
			// And the folders above it, if the test made them (empty).
			for d := filepath.Dir(filepath.Dir(keep)); d != "/var/lib" && d != "/" && d != "."; d = filepath.Dir(d) {
				if os.Remove(d) != nil {
					break
				}
			}
		}
	})
	h := &Host{NS: testutil.NewNS(t, prefix), T: t, Dir: dir, Binary: binary}
	h.Networks = h.WriteFile("networks.yaml", networksYAML)
	// Before dir goes: on failure, what the controller logged is in the
	// test's output (CI keeps nothing else).
	t.Cleanup(func() {
		if t.Failed() {
			h.logControllerLog(80)
		}
	})
	t.Cleanup(func() {
		exec.Command("pkill", "-9", "-f", "--", "--state-dir "+h.StateDir()).Run()
		exec.Command("pkill", "-9", "-f", "--", "--networks "+h.StateDir()).Run()
	})
	return h
}

// StateDir is the host's vmnetctl state dir.
func (h *Host) StateDir() string { return filepath.Join(h.Dir, "state") }

// WriteFile writes a file into the host's directory (its folders made
// if missing) and returns its path.
func (h *Host) WriteFile(name, content string) string {
	h.T.Helper()
	path := filepath.Join(h.Dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		h.T.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		h.T.Fatal(err)
	}
	return path
}

// VmnetctlArgs is the command line of vmnetctl with the host's state dir
// and networks, to run in its namespace.
func (h *Host) VmnetctlArgs(args ...string) []string {
	return append([]string{h.Binary, "--state-dir", h.StateDir(), "--networks", h.Networks}, args...)
}

// VmnetctlCommand is vmnetctl with the host's state dir and networks, in its namespace.
func (h *Host) VmnetctlCommand(ctx context.Context, args ...string) *exec.Cmd {
	argv := h.VmnetctlArgs(args...)
	cmd := h.NS.Command(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), h.Env...)
	return cmd
}

// Vmnetctl runs vmnetctl and returns its stdout; the error has both streams.
func (h *Host) Vmnetctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := h.VmnetctlCommand(ctx, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("vmnetctl %s: %w\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), nil
}

// MustVmnetctl is Vmnetctl that fails the test on error.
func (h *Host) MustVmnetctl(args ...string) string {
	h.T.Helper()
	out, err := h.Vmnetctl(args...)
	if err != nil {
		h.T.Fatal(err)
	}
	return out
}

// ReadStatus is `vmnetctl status --json`.
func (h *Host) ReadStatus() (*ctlapi.Status, error) {
	out, err := h.Vmnetctl("status", "--json")
	if err != nil {
		return nil, err
	}
	st := &ctlapi.Status{}
	if err := json.Unmarshal([]byte(out), st); err != nil {
		return nil, fmt.Errorf("status --json: %w\n%s", err, out)
	}
	return st, nil
}

// Status is ReadStatus that fails the test on error.
func (h *Host) Status() *ctlapi.Status {
	h.T.Helper()
	st, err := h.ReadStatus()
	if err != nil {
		h.T.Fatal(err)
	}
	return st
}

// Attachment returns the first attachment of vm in st.
func (h *Host) Attachment(st *ctlapi.Status, vm string) ctlapi.AttachmentStatus {
	h.T.Helper()
	for _, a := range st.Attachments {
		if a.VM == vm {
			return a
		}
	}
	h.T.Fatalf("status has no attachment for %s: %+v", vm, st.Attachments)
	return ctlapi.AttachmentStatus{}
}

// VM attaches a simulated VM to the helper socket of an attachment.
func (h *Host) VM(a ctlapi.AttachmentStatus) *VM {
	if a.Attach == "vhost-user" {
		return AttachVhostUser(h.T, "vm"+a.VM, a.MAC, a.Socket)
	}
	return AttachSocket(h.T, "vm"+a.VM, a.MAC, a.Socket, filepath.Join(h.Dir, fmt.Sprintf("%s.%d.client.sock", a.VM, a.Index)))
}

// HTTPClient is a client whose connections are made inside the namespace
// (to reach the controller's metrics on the host's loopback).
func (h *Host) HTTPClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := h.Do(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// logControllerLog logs the last n lines of the controller's log.
func (h *Host) logControllerLog(n int) {
	b, err := os.ReadFile(statedir.Dir{Path: h.StateDir()}.ControllerLog())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			h.T.Logf("controller log: %v", err)
		}
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	h.T.Logf("the controller's log, last %d lines:\n%s", n, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}
