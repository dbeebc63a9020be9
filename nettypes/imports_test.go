package nettypes

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsGoOneWay: the data plane (netplane) and the helper do not
// import backend, which composes them: the values they share are
// nettypes' (docs/architecture.md, the import order).
func TestImportsGoOneWay(t *testing.T) {
	deps := func(pkg string) string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", "github.com/vmnetctl/vmnetctl/"+pkg).Output()
		if err != nil {
			t.Skipf("go list: %v", err)
		}
		return string(out)
	}
	for _, pkg := range []string{"netplane", "helper"} {
		if strings.Contains(deps(pkg), "github.com/vmnetctl/vmnetctl/backend\n") {
			t.Errorf("%s imports backend", pkg)
		}
	}
}
