package netplane

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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

// tableComment reads the comment of the table name of family, with one
// request for the table alone; exists is false without the table.
func tableComment(family knftables.Family, name string) (comment string, exists bool, err error) {
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
		Data: append([]byte{nfproto(family), unix.NFNETLINK_V0, 0, 0}, attrs...),
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

// hasElement tells whether set of network id's guard table holds key (as
// netlink carries it: a MAC in 6 bytes, a concatenation padded per
// field), with one netlink request for that element alone, as `nft get
// element` sends (NFT_MSG_GETSETELEM without NLM_F_DUMP): no subprocess,
// and the cost of one element however many the set holds. A missing set
// or table holds nothing. google/nftables reads whole sets only.
func hasElement(id, set string, key []byte) (bool, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
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
		return false, err
	}
	data := append([]byte{nfproto(knftables.BridgeFamily), unix.NFNETLINK_V0, 0, 0}, attrs...)
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: data,
	})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("network %q: looking up an element of the guard's set %s: %w", id, set, err)
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

// nfproto is a knftables family as netlink numbers it.
func nfproto(family knftables.Family) byte {
	if family == knftables.BridgeFamily {
		return unix.NFPROTO_BRIDGE
	}
	return unix.NFPROTO_INET
}

// tableChains lists the names of the chains of table name of family.
func tableChains(family knftables.Family, name string) ([]string, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamily(nfproto(family)))
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

// hasVmapRule tells whether chain of table name of family has a rule that
// looks a verdict up in the map set (`... vmap @set`), reading that chain's
// rules alone.
func hasVmapRule(family knftables.Family, name, chain, set string) (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	rules, err := conn.GetRules(&nftables.Table{Name: name, Family: nftables.TableFamily(nfproto(family))}, &nftables.Chain{Name: chain})
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("nftables: reading chain %s of %s %s: %w", chain, family, name, err)
	}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok && l.IsDestRegSet && strings.EqualFold(l.SetName, set) {
				return true, nil
			}
		}
	}
	return false, nil
}
