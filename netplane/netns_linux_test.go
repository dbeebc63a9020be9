package netplane

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// threadNS is the inode of the calling thread's network namespace.
func threadNS(t *testing.T) uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestNSRunner: a network's functions run in its namespace whatever the
// thread that asks: at once from a thread in it (no switch), switched
// and back from one in another (a network made in a namespace the
// controller is not in, a goroutine locked in another).
func TestNSRunner(t *testing.T) {
	other := testutil.NewNS(t, "nsr")
	var otherIno uint64
	other.MustDo(t, func() error { otherIno = threadNS(t); return nil })
	here, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	defer here.Close()
	hereIno := threadNS(t)
	if hereIno == otherIno {
		t.Fatal("the test's namespace is the process's")
	}
	runHere, err := newNSRunner(here)
	if err != nil {
		t.Fatal(err)
	}
	otherNS, err := ns.GetNS(other.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer otherNS.Close()
	runOther, err := newNSRunner(otherNS)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, r *nsRunner, want uint64, direct bool) {
		t.Helper()
		if got := r.in(); got != direct {
			t.Errorf("%s: in() = %v, want %v", what, got, direct)
		}
		var got uint64
		if err := r.do(func() error { got = threadNS(t); return nil }); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: ran in namespace %d, want %d", what, got, want)
		}
	}
	check("the process's, from it", runHere, hereIno, true)
	check("another, from the process's", runOther, otherIno, false)
	if threadNS(t) != hereIno {
		t.Error("the calling thread was left in the other namespace")
	}
	other.MustDo(t, func() error {
		check("the process's, from a thread locked in another", runHere, hereIno, false)
		check("another, from a thread locked in it", runOther, otherIno, true)
		return nil
	})
}
