package hostnet

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// rtextFilterSkipStats asks a link dump to leave out the links' counters
// (RTEXT_FILTER_SKIP_STATS, linux/rtnetlink.h; not in x/sys/unix).
const rtextFilterSkipStats = 1 << 3

// BriefLink is what the passes need of a link: its index, name, master
// and alias; of a bridge's port (PortsOf), its port number too.
type BriefLink struct {
	Index, Master int
	Name, Alias   string
	// PortNo is a bridge port's number (IFLA_BRPORT_NO), as the
	// bridge's forwarding database names it; set by PortsOf only.
	PortNo uint16
}

// BriefLinks lists the links of the current namespace with only their
// names, indexes, masters and aliases: one dump without the counters,
// read without building a netlink.Link each. With a thousand VM ports the
// pass reads this several times; netlink.LinkList costs ten times more.
func BriefLinks() ([]BriefLink, error) {
	return briefLinks(0)
}

// PortsOf lists the links whose master is the link of index master (a
// bridge's ports), with their port numbers: the kernel sends only those
// (a dump filtered by IFLA_MASTER), where a dump of every link would
// cost every network as much as the ports of all the networks there are
// (a scrape at 10,000 VMs on 11 networks dumped 220,000 links).
func PortsOf(master int) ([]BriefLink, error) {
	return briefLinks(master)
}

// briefLinks dumps the links, those of master alone if not 0.
func briefLinks(master int) ([]BriefLink, error) {
	return RetryDump(func() ([]BriefLink, error) {
		req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)))
		if master != 0 {
			req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(master))))
		}
		// Each message as it comes, its attributes walked in place: at
		// 10,000 links, keeping the dump's messages and a parsed list of
		// attributes each put 40 MB of garbage into every pass.
		var out []BriefLink
		err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWLINK, func(m []byte) bool {
			if len(m) < unix.SizeofIfInfomsg {
				return true
			}
			l := BriefLink{Index: int(nl.DeserializeIfInfomsg(m).Index)}
			for typ, v := range Attrs(m[unix.SizeofIfInfomsg:]) {
				switch typ &^ unix.NLA_F_NESTED {
				case unix.IFLA_IFNAME:
					l.Name = cString(v)
				case unix.IFLA_IFALIAS:
					l.Alias = cString(v)
				case unix.IFLA_MASTER:
					if len(v) >= 4 {
						l.Master = int(native.Uint32(v))
					}
				case unix.IFLA_LINKINFO:
					if master != 0 {
						l.PortNo = bridgePortNo(v)
					}
				}
			}
			// (A kernel that does not filter sends every link.)
			if master == 0 || l.Master == master {
				out = append(out, l)
			}
			return true
		})
		return out, err
	})
}

// bridgePortNo is the port number in a bridge port's IFLA_LINKINFO
// (IFLA_INFO_SLAVE_DATA, IFLA_BRPORT_NO), 0 if it has none.
func bridgePortNo(linkinfo []byte) uint16 {
	for typ, v := range Attrs(linkinfo) {
		if typ&^unix.NLA_F_NESTED != unix.IFLA_INFO_SLAVE_DATA {
			continue
		}
		for typ, v := range Attrs(v) {
			if typ&^unix.NLA_F_NESTED == unix.IFLA_BRPORT_NO && len(v) >= 2 {
				return native.Uint16(v)
			}
		}
	}
	return 0
}

// native is the host's byte order, netlink's.
var native = nl.NativeEndian()

// cString is b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// LinkNames tells the name of the link of an interface index in the
// current namespace, one ioctl an index (the kernel's lookup), where a
// dump of every link would cost as much as the links there are.
type LinkNames struct{ fd int }

func OpenLinkNames() (LinkNames, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	return LinkNames{fd}, err
}

// LinkIndex is the interface index of the link name in the current
// namespace, 0 if there is none: one ioctl on a socket of its own.
func LinkIndex(name string) (uint32, error) {
	links, err := OpenLinkNames()
	if err != nil {
		return 0, err
	}
	defer links.Close()
	return links.IndexOf(name)
}

// IndexOf is the interface index of the link name, 0 if there is none.
func (l LinkNames) IndexOf(name string) (uint32, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, nil // not a name a link can have
	}
	switch err := unix.IoctlIfreq(l.fd, unix.SIOCGIFINDEX, ifr); {
	case errors.Is(err, unix.ENODEV):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("looking up link %s: %w", name, err)
	}
	return ifr.Uint32(), nil
}

// NameOf is the name of the link of interface index, "" if there is
// none; on any other failure than "no such device", ok is false and the
// link is taken to be there (a port's guard is better kept than removed).
func (l LinkNames) NameOf(index uint32) (name string, ok bool) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", false
	}
	ifr.SetUint32(index)
	switch err := unix.IoctlIfreq(l.fd, unix.SIOCGIFNAME, ifr); {
	case errors.Is(err, unix.ENODEV):
		return "", true
	case err != nil:
		return "", false
	}
	return ifr.Name(), true
}

func (l LinkNames) Close() { unix.Close(l.fd) }
