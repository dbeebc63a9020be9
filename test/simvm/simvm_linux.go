// Package simvm gives end-to-end tests simulated VMs: a network namespace
// (testutil.NS) whose eth0 is a TAP, with the frames of that TAP relayed to
// and from a vmnetctl helper's unix datagram socket, as qemu's `-netdev
// dgram` does; and real tools (busybox udhcpc, ping) running inside the
// namespace.
package simvm

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/test/testutil"
	"github.com/vmnetctl/vmnetctl/vhostuser"
)

// VM is a simulated VM: a namespace whose eth0 is a TAP relayed to a helper.
type VM struct {
	*testutil.NS
	MAC string

	tap    *os.File
	conn   *net.UnixConn
	remote *net.UnixAddr
	wg     sync.WaitGroup
	closed atomic.Bool
	stop   func() // a vhost-user VM's: ends its relay
}

// maxFrame is the largest frame the relay moves (jumbo MTUs included).
const maxFrame = 65536

// AttachSocket makes a simulated VM whose eth0 (with mac) is relayed to the
// helper socket at helperPath, from a client socket bound at clientPath:
// what qemu does with -netdev dgram,local.type=unix,...,remote.type=unix.
// Every datagram is sent to helperPath by name, so a restarted helper is
// reached again at the same path.
func AttachSocket(t testing.TB, name, mac, helperPath, clientPath string) *VM {
	t.Helper()
	vm := &VM{NS: testutil.NewNS(t, name), MAC: mac}
	vm.openTap(t)
	os.Remove(clientPath)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: clientPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	vm.conn, vm.remote = conn, &net.UnixAddr{Name: helperPath, Net: "unixgram"}
	vm.start()
	t.Cleanup(vm.Close)
	return vm
}

// AttachFD makes a simulated VM whose eth0 is relayed over conn, the VM's
// end of a connected socketpair whose other end a helper holds (--fd): how
// vfkit and krunkit talk to vmnet-helper.
func AttachFD(t testing.TB, name, mac string, conn *net.UnixConn) *VM {
	t.Helper()
	vm := &VM{NS: testutil.NewNS(t, name), MAC: mac, conn: conn}
	vm.openTap(t)
	vm.start()
	t.Cleanup(vm.Close)
	return vm
}

func (vm *VM) openTap(t testing.TB) {
	t.Helper()
	err := vm.Do(func() error {
		fd, err := testutil.OpenTAP("eth0")
		if err != nil {
			return err
		}
		// Non-blocking, so that the runtime poller owns it and Close
		// interrupts a pending Read.
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		vm.tap = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		t.Fatalf("creating the TAP of %s: %v", vm.Name, err)
	}
	for _, args := range [][]string{{"link", "set", "eth0", "address", vm.MAC}, {"link", "set", "eth0", "up"}} {
		if _, err := vm.Run(context.Background(), "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
}

func (vm *VM) start() {
	vm.wg.Add(2)
	go func() { // TAP → helper
		defer vm.wg.Done()
		buf := make([]byte, maxFrame)
		for {
			n, err := vm.tap.Read(buf)
			if err != nil {
				return
			}
			if vm.remote == nil {
				vm.conn.Write(buf[:n])
				continue
			}
			vm.conn.WriteToUnix(buf[:n], vm.remote) // a helper between restarts drops it, as a cable would
		}
	}()
	go func() { // helper → TAP
		defer vm.wg.Done()
		buf := make([]byte, maxFrame)
		for {
			n, err := vm.conn.Read(buf)
			if err != nil {
				if vm.closed.Load() || errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			vm.tap.Write(buf[:n])
		}
	}()
}

// AttachVhostUser makes a simulated VM whose eth0 (with mac) is a
// vhost-user guest of the helper serving socketPath: a VMM stand-in
// (vhostuser.Frontend) shares its memory and rings with the helper and
// moves frames between them and the TAP, as qemu's vhost-user-net and
// the guest's driver do.
func AttachVhostUser(t testing.TB, name, mac, socketPath string) *VM {
	t.Helper()
	vm := &VM{NS: testutil.NewNS(t, name), MAC: mac}
	fd := -1
	vm.MustDo(t, func() (err error) {
		fd, err = testutil.OpenTAP("eth0")
		return err
	})
	for _, args := range [][]string{{"link", "set", "eth0", "address", mac}, {"link", "set", "eth0", "up"}} {
		vm.MustRun(t, "ip", args...)
	}
	fe, err := vhostuser.Dial(socketPath, false)
	if err != nil {
		unix.Close(fd)
		t.Fatalf("%s: connecting to %s: %v", name, socketPath, err)
	}
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		fe.Relay(fd)
	}()
	vm.stop = func() {
		fe.Close() // ends Relay
		<-relayed
		unix.Close(fd)
	}
	t.Cleanup(vm.Close)
	return vm
}

// Close stops the relay and closes the TAP and socket.
func (vm *VM) Close() {
	if vm.closed.Swap(true) {
		return
	}
	if vm.stop != nil {
		vm.stop()
		return
	}
	vm.conn.Close()
	vm.tap.Close()
	vm.wg.Wait()
}

// DHCP runs busybox udhcpc on eth0 (testutil.NS.DHCP) and returns what
// the lease said: ip, mask, router, dns, mtu, lease and serverid.
func (vm *VM) DHCP(t testing.TB) map[string]string {
	t.Helper()
	lease, err := vm.NS.DHCP(t, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return lease
}
