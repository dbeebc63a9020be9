package hostnet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/hostnet"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestWatchLinkDeletion: the watch of one link's deletion hears of it,
// and of no other link made or deleted before (the kernel's filter: were
// they let through, Wait would return while the link is still there;
// were all kept out, it would not return at all).
func TestWatchLinkDeletion(t *testing.T) {
	host := testutil.NewNS(t, "lgone")
	host.MustRun(t, "ip", "link", "add", "watched", "type", "veth", "peer", "name", "watched1")
	var w *hostnet.LinkDeletion
	var index int
	host.MustDo(t, func() error {
		l, err := netlink.LinkByName("watched")
		if err != nil {
			return err
		}
		index = l.Attrs().Index
		w, err = hostnet.WatchLinkDeletion(index)
		return err
	})
	defer w.Close()
	heard := make(chan bool, 1) // whether the link was gone when Wait returned
	go func() {
		err := w.Wait()
		var gone bool
		host.Do(func() error {
			_, lerr := netlink.LinkByIndex(index)
			gone = lerr != nil
			return nil
		})
		heard <- err == nil && gone
	}()
	for i := range 10 {
		other := fmt.Sprintf("other%d", i)
		host.MustRun(t, "ip", "link", "add", other, "type", "veth", "peer", "name", other+"p")
		host.MustRun(t, "ip", "link", "set", other, "up")
		host.MustRun(t, "ip", "link", "del", other)
	}
	host.MustRun(t, "ip", "link", "set", "watched", "up")
	host.MustRun(t, "ip", "link", "del", "watched")
	select {
	case ok := <-heard:
		if !ok {
			t.Error("Wait returned before the watched link's deletion, or with an error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watched link's deletion was not heard")
	}
}
