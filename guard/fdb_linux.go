package guard

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/vmnetctl/vmnetctl/hostnet"
)

// The bridge's forwarding database, read at a cost that does not grow
// with the square of the ports.
//
// The kernel dumps a bridge's database (RTM_GETNEIGH, AF_BRIDGE) port by
// port, and walks the whole database for each port: a dump of every port's
// entries costs ports x entries (with 3,000 VMs, 18 million steps). A
// request whose header is a plain ndmsg, as netlink.NeighList sends, is
// read the old way, its port ignored: asking for one port's entries cost
// as much as asking for all, and a project's status, which asked port by
// port, cost ports x ports x entries (seconds at 2,000 VMs, in the kernel,
// on every `up`). hostnet.FDBOf asks as `bridge fdb show brport` does (an
// ifinfomsg header, which the kernel reads for the port): one walk of the
// database. bridgeFDB reads every port's entries from the bridge's
// brforward file in sysfs, one walk for all of them.

// fdbEntrySize is the size of struct __fdb_entry, brforward's record: the
// MAC (6), the port's number (low 8 bits), is_local, the ageing timer (4),
// the port number's high 8 bits, and padding.
const fdbEntrySize = 16

// BridgeFDB returns the MACs bridge br learned (or was given statically)
// on each of its ports, by the port's interface index: not the ports' own
// (local) entries. brPorts are br's ports (hostnet.PortsOf), whose port
// numbers the database names them by.
func BridgeFDB(br netlink.Link, brPorts []hostnet.BriefLink) (map[int][]net.HardwareAddr, error) {
	// sysfs shows the links of the namespace it was mounted in, which
	// need not be this thread's (moved by setns): its bridge of that name
	// must be br.
	dir := filepath.Join("/sys/class/net", br.Attrs().Name)
	index, err1 := os.ReadFile(filepath.Join(dir, "ifindex"))
	addr, err2 := os.ReadFile(filepath.Join(dir, "address"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	if strings.TrimSpace(string(index)) != strconv.Itoa(br.Attrs().Index) || strings.TrimSpace(string(addr)) != br.Attrs().HardwareAddr.String() {
		return nil, errOtherSysfs
	}
	ports := make(map[uint16]int, len(brPorts))
	for _, p := range brPorts {
		if p.Master == br.Attrs().Index && p.PortNo != 0 {
			ports[p.PortNo] = p.Index
		}
	}
	f, err := os.Open(filepath.Join(dir, "brforward"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Whole records only: the kernel fills the buffer with as many as fit.
	buf := make([]byte, 4096*fdbEntrySize)
	out := map[int][]net.HardwareAddr{}
	for {
		n, err := f.Read(buf)
		for b := buf[:n-n%fdbEntrySize]; len(b) >= fdbEntrySize; b = b[fdbEntrySize:] {
			if b[7] != 0 { // is_local
				continue
			}
			no := uint16(b[6]) | uint16(b[12])<<8
			if idx, ok := ports[no]; ok {
				out[idx] = append(out[idx], net.HardwareAddr(slicesClone(b[:6])))
			}
		}
		if errors.Is(err, io.EOF) || err == nil && n == 0 {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the forwarding database of %s: %w", br.Attrs().Name, err)
		}
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// errOtherSysfs: /sys shows another namespace's links than this thread's.
var errOtherSysfs = errors.New("sysfs shows another network namespace")
