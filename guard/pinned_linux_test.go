package guard

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestPinnedClaimTaken: a port pinned to a MAC that another port took
// after the pin read the guard (two helpers of the same MAC at once) is
// refused, and the batch changed nothing: the port that took it keeps it,
// and the pinned port keeps the MAC it held before and its place. A pin
// refused because the port's own guard changed since the read is not
// blamed on another port.
func TestPinnedClaimTaken(t *testing.T) {
	host := testutil.NewNS(t, "gpin")
	n := testutil.Network("gpin", api.ModeShared, "10.200.14.0/24")
	ctx := context.Background()
	m, old := net.HardwareAddr{0x52, 0x55, 0, 0, 0x0e, 1}, net.HardwareAddr{0x52, 0x55, 0, 0, 0x0e, 2}
	host.MustRun(t, "ip", "link", "add", "p-a", "type", "veth", "peer", "name", "q-a")
	host.MustRun(t, "ip", "link", "add", "p-b", "type", "veth", "peer", "name", "q-b")
	host.MustRun(t, "ip", "link", "add", "p-c", "type", "veth", "peer", "name", "q-c")
	host.MustDo(t, func() error {
		if err := EnsureTable(ctx, n); err != nil {
			return err
		}
		if err := AddPortKept(ctx, n, "p-b", old); err != nil {
			return err
		}
		ps, err := readPortState(n.ID, "p-b", m.String())
		if err != nil || ps.claimed || ps.held != old.String() {
			t.Fatalf("p-b before: %+v, %v; want it holding %s, %s free", ps, err, old, m)
		}
		// p-a takes m between p-b's read and its write.
		if err := AddPortKept(ctx, n, "p-a", m); err != nil {
			return err
		}
		err = guardPinned(ctx, n.ID, "p-b", ps, m)
		if err == nil || !strings.Contains(err.Error(), "MAC "+m.String()+" is another VM port's") {
			t.Errorf("p-b pinned to %s that p-a took: %v, want a refusal", m, err)
		}
		for port, want := range map[string]string{"p-a": m.String(), "p-b": old.String()} {
			if got, err := ReadHeld(n.ID, port); err != nil || got != want {
				t.Errorf("%s holds %q (%v) after the refusal, want %q", port, got, err, want)
			}
		}
		idx, err := hostnet.LinkIndex("p-b")
		if err != nil {
			return err
		}
		for _, c := range []struct {
			set string
			key []byte
		}{{SetGuarded, portKey(idx)}, {SetClaimed, old}, {SetPortMACs, portMACKey(idx, old)}} {
			if ok, err := hostnet.HasElement(n.ID, c.set, c.key); err != nil || !ok {
				t.Errorf("%s lost %x in the refused batch (%v)", c.set, c.key, err)
			}
		}
		if ok, _ := hostnet.HasElement(n.ID, SetPortMACs, portMACKey(idx, m)); ok {
			t.Errorf("the refused batch left p-b's %s in %s", m, SetPortMACs)
		}
		// Once p-a lets it go, the same pin takes it and releases old.
		if err := RemovePort(ctx, n, "p-a"); err != nil {
			return err
		}
		if ps, err = readPortState(n.ID, "p-b", m.String()); err != nil {
			return err
		}
		if err := guardPinned(ctx, n.ID, "p-b", ps, m); err != nil {
			t.Errorf("p-b pinned to %s once free: %v", m, err)
		}
		if got, _ := ReadHeld(n.ID, "p-b"); got != m.String() {
			t.Errorf("p-b holds %q, want %s", got, m)
		}
		if ok, _ := hostnet.HasElement(n.ID, SetClaimed, old); ok {
			t.Errorf("%s, which p-b held before, is still claimed", old)
		}
		// p-c, read holding nothing, comes to hold a MAC of its own before
		// its pin (as a learning port learns one): refused too, but not
		// as another port's MAC, which free is not.
		free := net.HardwareAddr{0x52, 0x55, 0, 0, 0x0e, 3}
		if ps, err = readPortState(n.ID, "p-c", free.String()); err != nil || ps.held != "" {
			t.Fatalf("p-c before: %+v, %v", ps, err)
		}
		if err := AddPortKept(ctx, n, "p-c", old); err != nil {
			return err
		}
		err = guardPinned(ctx, n.ID, "p-c", ps, free)
		if err == nil || strings.Contains(err.Error(), "another VM port's") || !strings.Contains(err.Error(), "its guard changed") {
			t.Errorf("p-c pinned to %s after it came to hold %s: %v, want its guard's change named", free, old, err)
		}
		if got, _ := ReadHeld(n.ID, "p-c"); got != old.String() {
			t.Errorf("p-c holds %q after the refusal, want %s", got, old)
		}
		return nil
	})
}
