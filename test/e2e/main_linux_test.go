package e2e

import (
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// vmnetctlBin is the vmnetctl binary under test, built once by TestMain.
var vmnetctlBin string

func TestMain(m *testing.M) { testutil.MainWithVmnetctl(m, &vmnetctlBin) }
