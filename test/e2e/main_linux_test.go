package e2e

import (
	"testing"

	"github.com/vmnetctl/vmnetctl/test/simvm"
)

// TestMain builds the vmnetctl binary under test once (simvm.Host runs it).
func TestMain(m *testing.M) { simvm.Main(m) }
