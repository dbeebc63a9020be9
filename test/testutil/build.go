package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// VmnetctlPackage is the import path of the vmnetctl command.
const VmnetctlPackage = "github.com/vmnetctl/vmnetctl/cmd/vmnetctl"

// Build builds the Go command pkg into dir and returns the binary's path:
// vmnetctl-relay without cgo, static, as the Makefile builds it (a start
// per attachment: the dynamic loader was a quarter of it).
func Build(dir, pkg string) (string, error) {
	binary := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", binary, pkg)
	if pkg == RelayPackage {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", pkg, err, out)
	}
	return binary, nil
}

// RelayPackage is the import path of vmnetctl-relay, which the helper
// execs into and finds next to the vmnetctl binary.
const RelayPackage = "github.com/vmnetctl/vmnetctl/cmd/vmnetctl-relay"

// HelperPackage is the import path of vmnetctl-helper, which the
// controller runs for `vmnetctl helper` when it is next to vmnetctl.
const HelperPackage = "github.com/vmnetctl/vmnetctl/cmd/vmnetctl-helper"

// BuildVmnetctl builds vmnetctl, and vmnetctl-relay and vmnetctl-helper
// beside it, into dir and returns vmnetctl's path. As a package installs
// them: dir may be searched by anyone, vmnetctl-relay is mode 0711 (a
// helper that dropped to the VM's owner execs it: docs/helper.md).
func BuildVmnetctl(dir string) (string, error) {
	relayBin, err := Build(dir, RelayPackage)
	if err != nil {
		return "", err
	}
	if _, err := Build(dir, HelperPackage); err != nil {
		return "", err
	}
	if err := os.Chmod(relayBin, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	return Build(dir, VmnetctlPackage)
}

// MainWithVmnetctl is a TestMain for packages that run the vmnetctl binary:
// it builds it into *binary (in a directory of its own), runs the tests and
// removes the binary.
func MainWithVmnetctl(m *testing.M, binary *string) {
	dir, err := os.MkdirTemp("", "vmnetctl-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binary, err = BuildVmnetctl(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
