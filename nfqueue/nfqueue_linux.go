package nfqueue

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The protocol's numbers (include/uapi/linux/netfilter/nfnetlink_queue.h),
// which x/sys does not carry.
const (
	msgPacket  = 0 // NFQNL_MSG_PACKET
	msgVerdict = 1 // NFQNL_MSG_VERDICT
	msgConfig  = 2 // NFQNL_MSG_CONFIG

	attrPacketHdr  = 1  // NFQA_PACKET_HDR
	attrVerdictHdr = 2  // NFQA_VERDICT_HDR
	attrMark       = 3  // NFQA_MARK
	attrInDev      = 5  // NFQA_IFINDEX_INDEV
	attrOutDev     = 6  // NFQA_IFINDEX_OUTDEV
	attrPayload    = 10 // NFQA_PAYLOAD

	attrCfgCmd    = 1 // NFQA_CFG_CMD
	attrCfgParams = 2 // NFQA_CFG_PARAMS
	attrCfgMaxLen = 3 // NFQA_CFG_QUEUE_MAXLEN

	cmdBind = 1 // NFQNL_CFG_CMD_BIND

	copyPacket = 2 // NFQNL_COPY_PACKET
)

// Verdict is what becomes of a queued packet (the kernel's NF_* verdicts).
type Verdict uint32

const (
	// Drop drops the packet.
	Drop Verdict = 0 // NF_DROP
	// Accept lets it go on from the rule after the one that queued it.
	Accept Verdict = 1 // NF_ACCEPT
	// Repeat sends it through its hook again, from the first rule: with a
	// mark, rules before the queue's can tell it and decide.
	Repeat Verdict = 4 // NF_REPEAT
)

// Packet is one queued packet: its id for the verdict, its mark, the
// interfaces it came in on and goes out on (their indexes; 0 for none:
// a packet of the host's own has no InDev), and its bytes from the
// network header on (at most the copy range Open asked for).
type Packet struct {
	ID            uint32
	Mark          uint32
	InDev, OutDev uint32
	Payload       []byte
}

// Queue is a netlink socket bound to one queue number.
type Queue struct {
	c   *netlink.Conn
	num uint16
}

// Open binds queue num in the current network namespace: its packets come
// to this socket, each with at most copyRange bytes, at most maxLen of
// them waiting for a verdict (more are dropped: the check fails closed).
// Only one socket binds a queue number.
func Open(num uint16, copyRange, maxLen uint32) (*Queue, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nfqueue: %w", err)
	}
	q := &Queue{c: c, num: num}
	params := make([]byte, 5) // struct nfqnl_msg_config_params, packed
	binary.BigEndian.PutUint32(params, copyRange)
	params[4] = copyPacket
	maxLenB := binary.BigEndian.AppendUint32(nil, maxLen)
	if err := q.config(
		netlink.Attribute{Type: attrCfgCmd, Data: command(cmdBind)},
		netlink.Attribute{Type: attrCfgParams, Data: params},
		netlink.Attribute{Type: attrCfgMaxLen, Data: maxLenB},
	); err != nil {
		c.Close()
		return nil, fmt.Errorf("nfqueue: binding queue %d: %w", num, err)
	}
	return q, nil
}

// command is struct nfqnl_msg_config_cmd: a command, a pad byte, and the
// protocol family (none: the queue number says which queue).
func command(cmd byte) []byte { return []byte{cmd, 0, 0, 0} }

// config sends a NFQNL_MSG_CONFIG of attrs and waits for its
// acknowledgement.
func (q *Queue) config(attrs ...netlink.Attribute) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	_, err = q.c.Execute(q.message(msgConfig, netlink.Request|netlink.Acknowledge, data))
	return err
}

// message is a nfnetlink_queue message of type typ: struct nfgenmsg (the
// family, the version, the queue number in network order), then data.
func (q *Queue) message(typ uint16, flags netlink.HeaderFlags, data []byte) netlink.Message {
	b := make([]byte, 4, 4+len(data))
	b[0], b[1] = unix.AF_UNSPEC, unix.NFNETLINK_V0
	binary.BigEndian.PutUint16(b[2:], q.num)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_QUEUE<<8 | typ), Flags: flags},
		Data:   append(b, data...),
	}
}

// Receive waits for the next queued packets. Their Payloads are theirs
// (the socket's buffer is not reused under them).
func (q *Queue) Receive() ([]Packet, error) {
	msgs, err := q.c.Receive()
	if err != nil {
		return nil, err
	}
	var out []Packet
	for _, m := range msgs {
		if m.Header.Type&0xff != msgPacket || len(m.Data) < 4 {
			continue
		}
		p, err := parsePacket(m.Data[4:])
		if err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePacket reads a NFQNL_MSG_PACKET's attributes.
func parsePacket(data []byte) (Packet, error) {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return Packet{}, err
	}
	var p Packet
	hdr := false
	for ad.Next() {
		b := ad.Bytes()
		switch ad.Type() {
		case attrPacketHdr:
			if len(b) < 7 { // struct nfqnl_msg_packet_hdr, packed
				return Packet{}, errors.New("nfqueue: a packet's header is short")
			}
			p.ID, hdr = binary.BigEndian.Uint32(b), true
		case attrMark:
			if len(b) >= 4 {
				p.Mark = binary.BigEndian.Uint32(b)
			}
		case attrInDev:
			if len(b) >= 4 {
				p.InDev = binary.BigEndian.Uint32(b)
			}
		case attrOutDev:
			if len(b) >= 4 {
				p.OutDev = binary.BigEndian.Uint32(b)
			}
		case attrPayload:
			p.Payload = b
		}
	}
	if err := ad.Err(); err != nil {
		return Packet{}, err
	}
	if !hdr {
		return Packet{}, errors.New("nfqueue: a packet without its header")
	}
	return p, nil
}

// SetVerdict gives packet id its verdict; with mark non-nil, the packet
// takes that mark (with Repeat, the rules it meets again see it).
func (q *Queue) SetVerdict(id uint32, v Verdict, mark *uint32) error {
	vh := make([]byte, 8) // struct nfqnl_msg_verdict_hdr
	binary.BigEndian.PutUint32(vh, uint32(v))
	binary.BigEndian.PutUint32(vh[4:], id)
	attrs := []netlink.Attribute{{Type: attrVerdictHdr, Data: vh}}
	if mark != nil {
		attrs = append(attrs, netlink.Attribute{Type: attrMark, Data: binary.BigEndian.AppendUint32(nil, *mark)})
	}
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	_, err = q.c.Send(q.message(msgVerdict, netlink.Request, data))
	return err
}

// Close closes the socket, which unbinds the queue: packets queued to it
// from then on are dropped, until another binds it. A Receive under way
// returns an error.
func (q *Queue) Close() error { return q.c.Close() }
