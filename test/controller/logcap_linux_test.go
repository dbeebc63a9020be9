package controller_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestLogCapBetweenReconciles: a helper's log past its cap is rotated
// within seconds even when no reconcile comes (the resync is an hour): the
// controller checks the logs' sizes on a ticker of its own.
func TestLogCapBetweenReconciles(t *testing.T) {
	h := newHost(t)
	h.Env = append(h.Env, "VMNETCTL_RESYNC=1h")
	vms := h.WriteFile("vms.yaml", "vms:\n  a:\n    networks:\n      - vmnet: shared\n")
	h.MustVmnetctl("up", "-f", vms)
	log := statedir.Dir{Path: h.StateDir()}.HelperLogFile("a/0")
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(bytes.Repeat([]byte("INFO  [main] filler\n"), statedir.MaxHelperLog/20+1000))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		fi, err := os.Stat(log)
		if err != nil {
			return err
		}
		if fi.Size() > statedir.MaxHelperLog {
			return fmt.Errorf("%s is %d bytes", log, fi.Size())
		}
		if _, err := os.Stat(log + ".1"); err != nil {
			return err
		}
		return nil
	}, "the helper's log rotated")
}
