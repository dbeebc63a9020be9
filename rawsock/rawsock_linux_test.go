package rawsock

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// TestListen: a packet sent with SendTo to a link's Ethernet address is
// read, as sent, by a socket on that link whose filter passes it, and by
// none whose filter drops it (read after the first got it: it was there).
func TestListen(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	ns := testutil.NewNS(t, "rs")
	ns.MustRun(t, "ip", "link", "add", "rs-a", "type", "veth", "peer", "name", "rs-b")
	ns.MustRun(t, "ip", "link", "set", "rs-a", "up")
	ns.MustRun(t, "ip", "link", "set", "rs-b", "up")
	passAll := []bpf.Instruction{bpf.RetConstant{Val: 0xffff}}
	dropAll := []bpf.Instruction{bpf.RetConstant{Val: 0}}
	pkt := append([]byte{0x45}, bytes.Repeat([]byte{7}, 40)...)
	if err := ns.Do(func() error {
		a, err := net.InterfaceByName("rs-a")
		if err != nil {
			return err
		}
		b, err := net.InterfaceByName("rs-b")
		if err != nil {
			return err
		}
		out, err := Listen(a.Index, unix.ETH_P_IP, dropAll, "out")
		if err != nil {
			return err
		}
		defer out.Close()
		in, err := Listen(b.Index, unix.ETH_P_IP, passAll, "in")
		if err != nil {
			return err
		}
		defer in.Close()
		none, err := Listen(b.Index, unix.ETH_P_IP, dropAll, "none")
		if err != nil {
			return err
		}
		defer none.Close()
		if err := SendTo(out, a.Index, unix.ETH_P_IP, b.HardwareAddr, pkt); err != nil {
			return err
		}
		read := func(f *os.File, wait time.Duration) ([]byte, error) {
			raw, err := f.SyscallConn()
			if err != nil {
				return nil, err
			}
			f.SetReadDeadline(time.Now().Add(wait))
			buf := make([]byte, 2048)
			n, from, err := RecvFrom(raw, buf)
			if err != nil {
				return nil, err
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || !bytes.Equal(ll.Addr[:6], a.HardwareAddr) {
				return nil, errors.New("the packet's source is not a's address")
			}
			return buf[:n], nil
		}
		got, err := read(in, time.Minute)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, pkt) {
			return errors.New("the packet read is not the one sent")
		}
		if _, err := read(none, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
			return errors.New("a socket whose filter drops everything read a packet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
