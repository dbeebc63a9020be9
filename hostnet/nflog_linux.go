package hostnet

import (
	"encoding/binary"
	"errors"
	"net"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NFLOG's protocol (linux/netfilter/nfnetlink_log.h; x/sys lacks it).
const (
	nfulnlMsgPacket    = 0
	nfulnlMsgConfig    = 1
	nfulaIfindexIndev  = 4
	nfulaIfindexPhysIn = 6
	nfulaPayload       = 9
	nfulaCfgCmd        = 1
	nfulaCfgMode       = 2
	nfulaCfgQThresh    = 5
	nfulnlCfgCmdBind   = 1
	nfulnlCopyPacket   = 2
)

// NFLOG reads the packets nftables rules copy to one NFLOG group (`log
// group N`): the guard's ARPs for the IPv4 learner, the denied
// connections of an egress policy. Open it in the namespace whose rules
// copy to it.
type NFLOG struct {
	conn *netlink.Conn
}

// LoggedPacket is one packet a rule copied: its first bytes (the network
// header on, for the inet and bridge families' IP packets and ARPs), and
// the devices it came in on (with bridge netfilter, indev is the bridge
// and physin the port; without it, indev is the port).
type LoggedPacket struct {
	Payload       []byte
	InDev, PhysIn uint32
}

// OpenNFLOG binds NFLOG group, each packet copied up to copyRange bytes
// and handed over at once (the kernel's default holds them until 100 are
// queued or a second went by). The kernel lets one socket bind a group:
// another's holding it is an error.
func OpenNFLOG(group uint16, copyRange uint32) (*NFLOG, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	config := func(attrs func(*netlink.AttributeEncoder)) error {
		ae := netlink.NewAttributeEncoder()
		attrs(ae)
		b, err := ae.Encode()
		if err != nil {
			return err
		}
		hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}
		binary.BigEndian.PutUint16(hdr[2:], group)
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, b...),
		})
		return err
	}
	mode := binary.BigEndian.AppendUint32(nil, copyRange)
	mode = append(mode, nfulnlCopyPacket, 0)
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	err = config(func(ae *netlink.AttributeEncoder) { ae.Bytes(nfulaCfgCmd, []byte{nfulnlCfgCmdBind}) })
	if err == nil {
		err = config(func(ae *netlink.AttributeEncoder) {
			ae.Bytes(nfulaCfgMode, mode)
			ae.Bytes(nfulaCfgQThresh, qthresh)
		})
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &NFLOG{conn: c}, nil
}

// Receive waits for the next packets. After Close it fails with an error
// that is net.ErrClosed; ENOBUFS says a burst was lost.
func (f *NFLOG) Receive() ([]LoggedPacket, error) {
	msgs, err := f.conn.Receive()
	if err != nil {
		return nil, err
	}
	var out []LoggedPacket
	for _, m := range msgs {
		if p, ok := loggedPacket(m); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// loggedPacket reads one NFLOG message.
func loggedPacket(m netlink.Message) (LoggedPacket, bool) {
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return LoggedPacket{}, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return LoggedPacket{}, false
	}
	ad.ByteOrder = binary.BigEndian
	var p LoggedPacket
	for ad.Next() {
		switch ad.Type() {
		case nfulaPayload:
			p.Payload = ad.Bytes()
		case nfulaIfindexIndev:
			p.InDev = ad.Uint32()
		case nfulaIfindexPhysIn:
			p.PhysIn = ad.Uint32()
		}
	}
	return p, ad.Err() == nil && p.Payload != nil
}

// Close ends Receive.
func (f *NFLOG) Close() error { return f.conn.Close() }

// IsClosed tells whether err is Receive's after Close.
func IsClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
