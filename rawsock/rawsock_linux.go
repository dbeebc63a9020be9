// Package rawsock is the packet sockets the DHCP server and the IPv6
// learner read a bridge through: opened on one link for one ethertype,
// with a classic BPF filter attached before they are bound, so that no
// other packet is ever queued; read and written in Go's poller.
package rawsock

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Listen opens a packet socket of type SOCK_DGRAM (what it reads starts at
// the network header, and its sender is the frame's source) for ethertype
// on link ifindex, filter attached before it is bound. name names the
// file it returns, non-blocking, in Go's poller.
func Listen(ifindex int, ethertype uint16, filter []bpf.Instruction, name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(Proto(ethertype)))
	if err != nil {
		return nil, err
	}
	err = AttachFilter(fd, filter)
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: Proto(ethertype), Ifindex: ifindex})
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// AttachFilter sets a classic BPF socket filter on fd.
func AttachFilter(fd int, prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
}

// Proto is ethertype as a packet socket's protocol wants it: in network
// byte order.
func Proto(ethertype uint16) uint16 { return ethertype<<8 | ethertype>>8 }

// RecvFrom reads one packet from a packet socket in Go's poller, waiting
// for it as a blocking read would (and honouring its deadline).
func RecvFrom(raw syscall.RawConn, buf []byte) (int, unix.Sockaddr, error) {
	var n int
	var from unix.Sockaddr
	var rerr error
	err := raw.Read(func(fd uintptr) bool {
		n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	return n, from, err
}

// SendTo sends pkt from packet socket f, for ethertype, in a frame to the
// Ethernet address to alone on link ifindex.
func SendTo(f *os.File, ifindex int, ethertype uint16, to net.HardwareAddr, pkt []byte) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	sa := &unix.SockaddrLinklayer{Protocol: Proto(ethertype), Ifindex: ifindex, Halen: 6}
	copy(sa.Addr[:], to)
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), pkt, 0, sa)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}
