package hostnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// The reads a controller's pass makes of every network, through netlink in
// this process and limited to what they need: `nft list` reads the whole
// table, every port's chain and rules with it, which for a network of
// 1,000 ports takes seconds (and nft's process) on every pass.

// nftaTableUserdata is the kernel's NFTA_TABLE_USERDATA (x/sys lacks it),
// where nft keeps a table's comment; udataComment is the comment's type
// in it (libnftnl's NFTNL_UDATA_TABLE_COMMENT).
const (
	nftaTableUserdata = 6
	udataComment      = 0
)

// TableComment reads the comment of the table name of family, with one
// request for the table alone; exists is false without the table.
func TableComment(family knftables.Family, name string) (comment string, exists bool, err error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return "", false, fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_TABLE_NAME, name)
	attrs, err := ae.Encode()
	if err != nil {
		return "", false, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request,
		},
		Data: append([]byte{NFProto(family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("nftables: reading table %s %s: %w", family, name, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return "", true, err
		}
		for ad.Next() {
			if ad.Type() == nftaTableUserdata {
				comment = udataString(ad.Bytes(), udataComment)
			}
		}
	}
	return comment, true, nil
}

// HasElement tells whether set of network id's guard table holds key (as
// netlink carries it: a MAC in 6 bytes, a concatenation padded per
// field). A missing set or table holds nothing.
func HasElement(id, set string, key []byte) (bool, error) {
	e, err := LookupElement(id, set, key)
	return e != nil, err
}

// Element is what LookupElement reads of a set's element: its data (a
// map's value) and the packets of its counter, if it has one.
type Element struct {
	Data    []byte
	Packets uint64
}

// LookupElement reads the element key of set of network id's guard table,
// nil if it has none, with one netlink request for that element alone, as
// `nft get element` sends (NFT_MSG_GETSETELEM without NLM_F_DUMP): no
// subprocess, and the cost of one element however many the set holds. A
// missing set or table holds nothing. google/nftables reads whole sets
// only.
func LookupElement(id, set string, key []byte) (*Element, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, TableName(id))
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	data := append([]byte{NFProto(knftables.BridgeFamily), unix.NFNETLINK_V0, 0, 0}, attrs...)
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: data,
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("network %q: looking up an element of the guard's set %s: %w", id, set, err)
	}
	e := &Element{}
	for _, m := range msgs {
		if len(m.Data) > 4 {
			decodeElement(m.Data[4:], e)
		}
	}
	return e, nil
}

// decodeElement reads into e what a GETSETELEM answer b (its attributes)
// says of its one element.
func decodeElement(b []byte, e *Element) {
	nested := func(b []byte, typ uint16, f func([]byte)) {
		ad, err := netlink.NewAttributeDecoder(b)
		if err != nil {
			return
		}
		for ad.Next() {
			if ad.Type() == typ {
				f(ad.Bytes())
			}
		}
	}
	nested(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(b []byte) {
		nested(b, unix.NFTA_LIST_ELEM, func(b []byte) {
			nested(b, unix.NFTA_SET_ELEM_DATA, func(b []byte) {
				nested(b, unix.NFTA_DATA_VALUE, func(v []byte) { e.Data = v })
			})
			nested(b, unix.NFTA_SET_ELEM_EXPR, func(b []byte) {
				nested(b, unix.NFTA_EXPR_DATA, func(b []byte) {
					nested(b, unix.NFTA_COUNTER_PACKETS, func(v []byte) {
						if len(v) == 8 {
							e.Packets = binary.BigEndian.Uint64(v)
						}
					})
				})
			})
		})
	})
}

// udataString is the string of type typ in nftables user data (type,
// length, value; the value NUL-terminated).
func udataString(b []byte, typ byte) string {
	for len(b) >= 2 && int(b[1]) <= len(b)-2 {
		t, v := b[0], b[2:2+int(b[1])]
		if t == typ {
			return string(bytes.TrimRight(v, "\x00"))
		}
		b = b[2+int(b[1]):]
	}
	return ""
}

// NFProto is a knftables family as netlink numbers it.
func NFProto(family knftables.Family) byte {
	if family == knftables.BridgeFamily {
		return unix.NFPROTO_BRIDGE
	}
	return unix.NFPROTO_INET
}

// TableChains lists the names of the chains of table name of family.
func TableChains(family knftables.Family, name string) ([]string, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamily(NFProto(family)))
	if err != nil {
		return nil, fmt.Errorf("nftables: listing the chains of %s %s: %w", family, name, err)
	}
	var out []string
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == name {
			out = append(out, ch.Name)
		}
	}
	return out, nil
}

// ElementChange is one change of an element in ChangeElements' batch:
// added to Set (with Data, a map's value), or with Delete deleted from it.
// Exclusive makes the batch fail, whole, with EEXIST when the set already
// holds Key: what `nft create element` says, and google/nftables' adds
// cannot.
type ElementChange struct {
	Set       string
	Key, Data []byte
	Delete    bool
	Exclusive bool
}

// ChangeElements makes changes to the sets of network id's table of
// family in one netlink batch, in order: all or none. It reads nothing
// first, as `nft -f` of the same `add`, `create` and `delete element`
// commands would (a process, and a look at the table's sets), and, as
// they, it fails on a set or table that is not there.
func ChangeElements(ctx context.Context, family knftables.Family, id string, changes []ElementChange) error {
	if len(changes) == 0 {
		return nil
	}
	header := func(t uint16, flags netlink.HeaderFlags, proto byte, resID uint16, attrs []byte) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(t), Flags: flags},
			Data: append([]byte{proto, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}, attrs...)}
	}
	msgs := []netlink.Message{header(unix.NFNL_MSG_BATCH_BEGIN, netlink.Request, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)}
	for _, c := range changes {
		ae := netlink.NewAttributeEncoder()
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, TableName(id))
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, c.Set)
		ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
				ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
					ae.Bytes(unix.NFTA_DATA_VALUE, c.Key)
					return nil
				})
				if c.Data != nil {
					ae.Nested(unix.NFTA_SET_ELEM_DATA, func(ae *netlink.AttributeEncoder) error {
						ae.Bytes(unix.NFTA_DATA_VALUE, c.Data)
						return nil
					})
				}
				return nil
			})
			return nil
		})
		attrs, err := ae.Encode()
		if err != nil {
			return err
		}
		t, flags := uint16(unix.NFT_MSG_NEWSETELEM), netlink.Request|netlink.Acknowledge|netlink.Create
		switch {
		case c.Delete:
			t, flags = unix.NFT_MSG_DELSETELEM, netlink.Request|netlink.Acknowledge
		case c.Exclusive:
			flags |= netlink.Excl
		}
		msgs = append(msgs, header(unix.NFNL_SUBSYS_NFTABLES<<8|t, flags, NFProto(family), 0, attrs))
	}
	msgs = append(msgs, header(unix.NFNL_MSG_BATCH_END, netlink.Request, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil))
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	if _, err := c.SendMessages(msgs); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	// The kernel runs the batch as it is sent: its answers wait in the
	// socket once the send returns. The deadline is for one that would
	// never come, not for a slow one (ctx's, or a minute).
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	c.SetReadDeadline(deadline)
	// An acknowledgement for each change, or an error: the kernel then
	// undid the whole batch, and may say no more (a refused batch is one
	// error, whatever it held).
	for range changes {
		switch _, err := c.Receive(); {
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("nftables: a set of table %s %s is missing: %w", family, TableName(id), err)
		case err != nil:
			return fmt.Errorf("nftables: changing the elements of table %s %s: %w", family, TableName(id), err)
		}
	}
	return nil
}

// NFTGeneration is the current namespace's nftables generation: the
// kernel counts up every committed transaction (any table, any family,
// anyone's), not reads, nor what the packet path adds to dynamic sets.
// A reader that saw a set at generation g and sees g again knows the set
// unchanged without reading it: one small request, not a dump.
func NFTGeneration() (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return 0, fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables: reading the generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, err
		}
	}
	return 0, errors.New("nftables: no generation in the kernel's answer")
}
