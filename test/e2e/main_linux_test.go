package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// vmnetctlBin is the vmnetctl binary under test, built once by TestMain.
var vmnetctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmnetctl-e2e-bin")
	if err != nil {
		panic(err)
	}
	vmnetctlBin = filepath.Join(dir, "vmnetctl")
	if out, err := exec.Command("go", "build", "-o", vmnetctlBin, "github.com/vmnetctl/vmnetctl/cmd/vmnetctl").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building vmnetctl: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
