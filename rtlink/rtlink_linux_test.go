package rtlink_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/rtlink"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestWatchDeletion: the watch of one link's deletion hears of it, and
// of no other link made or deleted before (the kernel's filter: were they
// let through, Wait would return while the link is still there; were all
// kept out, it would not return at all).
func TestWatchDeletion(t *testing.T) {
	host := testutil.NewNS(t, "lgone")
	host.MustRun(t, "ip", "link", "add", "watched", "type", "veth", "peer", "name", "watched1")
	var w *rtlink.Deletion
	var index int
	host.MustDo(t, func() error {
		l, err := netlink.LinkByName("watched")
		if err != nil {
			return err
		}
		index = l.Attrs().Index
		w, err = rtlink.WatchDeletion(index)
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
	// A closed watch's Wait returns.
	w2 := func() *rtlink.Deletion {
		var w2 *rtlink.Deletion
		host.MustDo(t, func() (err error) { w2, err = rtlink.WatchDeletion(1); return err })
		return w2
	}()
	done := make(chan error, 1)
	go func() { done <- w2.Wait() }()
	w2.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Wait on a closed watch returned nil")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end Wait")
	}
}

// TestLinkAndDelete: a TAP's flags and counters as the kernel keeps them
// (a frame written into it is one received; its carrier is on while a
// descriptor holds it), and its deletion by index, which leaves a link of
// the same name made since.
func TestLinkAndDelete(t *testing.T) {
	host := testutil.NewNS(t, "rtlink")
	host.MustDo(t, func() error {
		fd, index, err := makeTap("held0")
		if err != nil {
			return err
		}
		c, err := rtlink.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		frame := make([]byte, 60)
		copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5})
		if _, err := unix.Write(fd, frame); err != nil {
			return fmt.Errorf("writing a frame: %w", err)
		}
		l, err := c.Link(index)
		if err != nil {
			return err
		}
		if l.Counters.RxPackets != 1 || l.Counters.RxBytes != uint64(len(frame)) {
			return fmt.Errorf("after one frame of %d bytes: %+v", len(frame), l.Counters)
		}
		if l.Name != "held0" {
			return fmt.Errorf("link %d is named %q", index, l.Name)
		}
		if byName, err := c.LinkByName("held0"); err != nil || byName.Index != index || byName.Counters != l.Counters {
			return fmt.Errorf("held0 by name: %+v, %v; by index %+v", byName, err, l)
		}
		if _, err := c.LinkByName("nosuch0"); !errors.Is(err, rtlink.ErrGone) {
			return fmt.Errorf("a link that is not there by name: %v, want ErrGone", err)
		}
		if l.Flags&unix.IFF_UP == 0 || l.Flags&unix.IFF_LOWER_UP == 0 {
			return fmt.Errorf("a TAP that is up and held: flags %#x", l.Flags)
		}
		unix.Close(fd) // persistent: it stays, its carrier off
		if l, err = c.Link(index); err != nil || l.Flags&unix.IFF_LOWER_UP != 0 {
			return fmt.Errorf("a TAP no one holds: flags %#x, %v", l.Flags, err)
		}
		if err := c.Delete(index); err != nil {
			return err
		}
		if _, err := c.Link(index); !errors.Is(err, rtlink.ErrGone) {
			return fmt.Errorf("after its deletion: %v, want ErrGone", err)
		}
		if err := c.Delete(index); err != nil {
			return fmt.Errorf("deleting it again: %v", err)
		}
		fd2, index2, err := makeTap("held0")
		if err != nil {
			return err
		}
		unix.Close(fd2)
		if err := c.Delete(index); err != nil {
			return err
		}
		if _, err := c.Link(index2); err != nil {
			return fmt.Errorf("the TAP of the same name made since: %v", err)
		}
		return c.Delete(index2)
	})
}

// makeTap makes persistent TAP name, up, and gives its descriptor and
// interface index.
func makeTap(name string) (int, int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	ifr, _ := unix.NewIfreq(name)
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, l.Attrs().Index, nil
}

// TestPorts: a bridge's ports, each with its name and counters, and no
// other link.
func TestPorts(t *testing.T) {
	host := testutil.NewNS(t, "rtports")
	host.MustRun(t, "ip", "link", "add", "br0", "type", "bridge")
	host.MustRun(t, "ip", "link", "add", "br1", "type", "bridge")
	host.MustDo(t, func() error {
		var fds []int
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		for _, name := range []string{"p0", "p1", "other"} {
			fd, _, err := makeTap(name)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
		}
		br0, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		br1, _ := netlink.LinkByName("br1")
		for name, br := range map[string]netlink.Link{"p0": br0, "p1": br0, "other": br1} {
			l, _ := netlink.LinkByName(name)
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return err
			}
		}
		frame := make([]byte, 60)
		copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5})
		unix.Write(fds[1], frame)
		c, err := rtlink.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		ports, err := c.Ports(br0.Attrs().Index)
		if err != nil {
			return err
		}
		got := map[string]uint64{}
		for _, p := range ports {
			got[p.Name] = p.Counters.RxPackets
		}
		if len(got) != 2 || got["p1"] != 1 {
			return fmt.Errorf("br0's ports, by frames received: %v, want p0 and p1, p1 with 1", got)
		}
		return nil
	})
}
