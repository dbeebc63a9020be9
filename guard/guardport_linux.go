package guard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/hostnet"
)

// A port's guard is its elements in the guard table's sets, written in
// this process through netlink (google/nftables; a pinned port's, whose
// claim must be exclusive, hostnet.ChangeElements), one batch a change: no
// nft process, which would read the whole table first, and no chain,
// whose commit would make the kernel validate every port's. The rules are
// the network's (ensureGuardTable, with nft).

// portKey is a port's interface index as the sets' keys hold it (an
// iface_index: 32 bits in the host's order).
func portKey(index uint32) []byte { return binary.NativeEndian.AppendUint32(nil, index) }

// portMACKey is an element of port-macs: the index, then the MAC padded to
// 8 bytes (each field of a concatenation takes whole 32-bit words).
func portMACKey(index uint32, mac net.HardwareAddr) []byte {
	k := make([]byte, 12)
	binary.NativeEndian.PutUint32(k, index)
	copy(k[4:], mac)
	return k
}

// guardSet is set name of network id's guard table, as google/nftables
// names it for a change of its elements (which needs no more of it).
func guardSet(id, name string) *nftables.Set {
	return &nftables.Set{Table: &nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamilyBridge}, Name: name}
}

// portState is what GuardPort and UnguardPort need to know of network
// id's guard about one port and one MAC, read element by element: what it
// costs does not grow with the network's ports.
type portState struct {
	index        uint32 // the port's interface index; 0 if there is no such link
	guarded      bool   // the port is in guarded
	held         string // the MAC the port holds, "" for none
	heldExpected bool   // held is some port's expected MAC
	heldOwned    bool   // held is this port's expected MAC (owns)
	mine         bool   // mac is the port's expected MAC, or the one it holds
	claimed      bool   // mac is claimed: some port holds it or is expected to
}

// readPortState reads port's guard and what the guard says of mac ("" for
// none) on network id.
func readPortState(id, port, mac string) (portState, error) {
	var ps portState
	var err error
	if ps.index, err = hostnet.LinkIndex(port); err != nil || ps.index == 0 {
		return ps, err
	}
	has := func(set string, key []byte) (ok bool) {
		if err == nil {
			ok, err = hostnet.HasElement(id, set, key)
		}
		return ok
	}
	ps.guarded = has(SetGuarded, portKey(ps.index))
	if err == nil {
		ps.held, err = heldBy(id, ps.index)
	}
	if hw, perr := net.ParseMAC(ps.held); perr == nil {
		ps.heldExpected = has(SetExpected, hw)
		ps.heldOwned = ps.heldExpected && has(SetOwns, OwnsKey(PortMAC{ps.held, port}))
	}
	if hw, perr := net.ParseMAC(mac); perr == nil {
		ps.mine = ps.held == mac || has(SetOwns, OwnsKey(PortMAC{mac, port}))
		ps.claimed = !ps.mine && has(SetClaimed, hw)
	}
	return ps, err
}

// heldBy is the MAC the port of interface index holds on network id, ""
// for none.
func heldBy(id string, index uint32) (string, error) {
	e, err := hostnet.LookupElement(id, SetHeld, portKey(index))
	if err != nil || e == nil || len(e.Data) < 6 {
		return "", err
	}
	return net.HardwareAddr(e.Data[:6]).String(), nil
}

// ReadHeld is the MAC port holds on network id, "" for none (or no such
// port).
func ReadHeld(id, port string) (string, error) {
	index, err := hostnet.LinkIndex(port)
	if err != nil || index == 0 {
		return "", err
	}
	return heldBy(id, index)
}

// guardLearning is GuardPort for a learning port (ps its state): its old
// guard serves as it is if it holds nothing or the port's own expected
// MAC, which the new VM would learn anyway (a VM attached again under its
// name, a restarted helper: guarded by a lookup or two); else the MAC it
// held is released first. An add that deletes nothing is not held up by
// the kernel's wait for its readers.
func guardLearning(n *api.Network, port string, ps portState) error {
	if ps.guarded && (ps.held == "" || ps.heldOwned) {
		return nil
	}
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if ps.held != "" {
		if err := addRelease(conn, n.ID, portGuard{index: ps.index, held: ps.held, keepClaim: ps.heldExpected}); err != nil {
			return err
		}
	}
	if err := conn.SetAddElements(guardSet(n.ID, SetGuarded), []nftables.SetElement{{Key: portKey(ps.index)}}); err != nil {
		return err
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("network %q: guarding port %s: %w", n.ID, port, err)
	}
	return nil
}

// portGuard is a port's guard to remove or release: its interface index,
// the MAC it holds ("" for none), and whether that MAC stays claimed.
type portGuard struct {
	index     uint32
	held      string
	keepClaim bool
}

// addRelease adds to conn's batch the release of the MAC g holds (held,
// port-macs, and claimed unless g.keepClaim): the port may learn or be
// given another. Each element is added first (a no-op if it is there), so
// that its deletion finds it.
func addRelease(conn *nftables.Conn, id string, g portGuard) error {
	mac, err := net.ParseMAC(g.held)
	if err != nil {
		return nil
	}
	for _, c := range releaseChanges(g, mac) {
		s, elems := guardSet(id, c.Set), []nftables.SetElement{{Key: c.Key, Val: c.Data}}
		if c.Delete {
			err = conn.SetDeleteElements(s, elems)
		} else {
			err = conn.SetAddElements(s, elems)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseChanges is the release of mac, the MAC g holds: from held,
// port-macs and, unless g.keepClaim, claimed. Each element is added first
// (a no-op if it is there), so that its deletion finds it.
func releaseChanges(g portGuard, mac net.HardwareAddr) []hostnet.ElementChange {
	elems := []hostnet.ElementChange{
		{Set: SetHeld, Key: portKey(g.index), Data: mac},
		{Set: SetPortMACs, Key: portMACKey(g.index, mac)},
	}
	if !g.keepClaim {
		elems = append(elems, hostnet.ElementChange{Set: SetClaimed, Key: mac})
	}
	var out []hostnet.ElementChange
	for _, e := range elems {
		del := e
		del.Delete = true
		out = append(out, e, del)
	}
	return out
}

// addUnguard adds to conn's batch the removal of g's guard: its place in
// guarded, its drop counter, and its MAC (addRelease).
func addUnguard(conn *nftables.Conn, id string, g portGuard) error {
	key := []nftables.SetElement{{Key: portKey(g.index)}}
	for _, set := range []string{SetGuarded, guardDropCounts} {
		s := guardSet(id, set)
		if err := conn.SetAddElements(s, key); err != nil {
			return err
		}
		if err := conn.SetDeleteElements(s, key); err != nil {
			return err
		}
	}
	return addRelease(conn, id, g)
}

// unguardNL removes the guards gs of network id in one netlink batch.
func unguardNL(id string, gs []portGuard) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, g := range gs {
		if err := addUnguard(conn, id, g); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("network %q: removing the guards of %d ports: %w", id, len(gs), err)
	}
	return nil
}

// PruneGuards removes the guards of ports that no longer exist (a helper's
// TAP goes with its fd; its guard stays).
func PruneGuards(id string) error {
	gone, err := goneGuards(id, nil)
	if err != nil || len(gone) == 0 {
		return err
	}
	expected, err := ExpectedMACs(id)
	if err != nil {
		return err
	}
	return pruneGone(id, gone, expected)
}

// ExpectedMACs reads network id's guard's expected set: the MACs the
// attachments give their VMs.
func ExpectedMACs(id string) (map[string]bool, error) {
	elems, err := SetElements(id, SetExpected)
	out := map[string]bool{}
	for _, e := range elems {
		if len(e.Key) >= 6 {
			out[net.HardwareAddr(e.Key[:6]).String()] = true
		}
	}
	return out, err
}

// goneGuards is the guards of network id whose ports have no link, with
// the MACs they hold: among the ports of interface indexes only, each
// looked up alone, or, with only nil, among every guard of the network.
func goneGuards(id string, only []uint32) ([]portGuard, error) {
	var indexes []uint32
	if only == nil {
		elems, err := SetElements(id, SetGuarded) // none without the table
		if err != nil {
			return nil, err
		}
		for _, e := range elems {
			if len(e.Key) >= 4 {
				indexes = append(indexes, binary.NativeEndian.Uint32(e.Key))
			}
		}
	} else {
		for _, index := range only {
			switch guarded, err := hostnet.HasElement(id, SetGuarded, portKey(index)); {
			case err != nil:
				return nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, SetGuarded, err)
			case guarded:
				indexes = append(indexes, index)
			}
		}
	}
	links, err := hostnet.OpenLinkNames()
	if err != nil {
		return nil, fmt.Errorf("network %q: looking up the ports' links: %w", id, err)
	}
	defer links.Close()
	var gone []portGuard
	for _, index := range indexes {
		if name, ok := links.NameOf(index); !ok || name != "" {
			continue
		}
		held, err := heldBy(id, index)
		if err != nil {
			return nil, err
		}
		gone = append(gone, portGuard{index: index, held: held})
	}
	return gone, nil
}

// pruneGone removes the guards gone of network id, in batches of
// pruneChunk: a commit that deletes waits for the kernel's readers (10 to
// 20 ms here), once for a batch rather than once a port, and a batch and
// its acknowledgements must fit the socket's buffers. expected is the
// guard's expected MACs: those stay claimed.
func pruneGone(id string, gone []portGuard, expected map[string]bool) error {
	for chunk := range slices.Chunk(gone, PruneChunk) {
		for i := range chunk {
			chunk[i].keepClaim = expected[chunk[i].held]
		}
		if err := unguardNL(id, chunk); err != nil {
			return err
		}
	}
	return nil
}

// PruneChunk is the most ports whose guards one batch deletes (some ten
// messages each).
const PruneChunk = 16

// SetElements reads the elements of set name of network id's guard
// table through netlink (one small request, whatever else the table
// holds); none without the set or the table.
func SetElements(id, name string) ([]nftables.SetElement, error) {
	elems, err := hostnet.SetElements(nftables.TableFamilyBridge, id, name)
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, name, err)
	}
	return elems, nil
}

// readGuardStateNL reads the MACs of network id's guard table through
// netlink: owns, claimed, expected and, with learned, the MACs the ports
// hold (held, with the names of the ports that exist). All empty without
// the table.
func readGuardStateNL(id string, learned bool) (*State, error) {
	st := &State{Learned: map[string]string{}, index: map[string]uint32{}, Claimed: map[string]bool{}, Owns: map[PortMAC]bool{}, ExpectedMACs: map[string]bool{}}
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamilyBridge}
	names := []string{SetClaimed, SetOwns, SetExpected, SetGuarded, SetHeld}
	sets, err := namedSets(conn, tbl, names...)
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the guard's sets: %w", id, err)
	}
	st.exists = len(sets) == len(names)
	held := map[uint32]string{}
	for _, s := range sets {
		if s.Name == SetGuarded || !learned && s.Name == SetHeld {
			continue
		}
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, s.Name, err)
		}
		for _, e := range elems {
			switch {
			case s.Name == SetHeld && len(e.Key) >= 4 && len(e.Val) >= 6:
				held[binary.NativeEndian.Uint32(e.Key)] = net.HardwareAddr(e.Val[:6]).String()
			case s.Name == SetHeld || len(e.Key) < 6:
			case s.Name == SetClaimed:
				st.Claimed[net.HardwareAddr(e.Key[:6]).String()] = true
			case s.Name == SetExpected:
				st.ExpectedMACs[net.HardwareAddr(e.Key[:6]).String()] = true
			case s.Name == SetOwns && len(e.Key) >= 8+unix.IFNAMSIZ:
				st.Owns[PortMAC{net.HardwareAddr(e.Key[:6]).String(), string(bytes.TrimRight(e.Key[8:8+unix.IFNAMSIZ], "\x00"))}] = true
			}
		}
	}
	if len(held) > 0 {
		links, err := hostnet.OpenLinkNames()
		if err != nil {
			return nil, fmt.Errorf("network %q: looking up the ports' links: %w", id, err)
		}
		defer links.Close()
		for index, mac := range held {
			if name, ok := links.NameOf(index); ok && name != "" {
				st.Learned[name], st.index[name] = mac, index
			}
		}
	}
	return st, nil
}

// readStrays reads the elements of network id's port-macs that held does
// not hold. A guest whose VMM wrote two frames from two MACs at once, on
// two CPUs, as its port learned (a port's frames are checked one at a
// time when one thread writes them, as a helper's relay does) could make
// its port learn both: Check reports the second, and Ensure drops it.
func readStrays(id string) ([]portGuard, error) {
	pms, err := SetElements(id, SetPortMACs)
	if err != nil || len(pms) == 0 {
		return nil, err
	}
	hs, err := SetElements(id, SetHeld)
	if err != nil {
		return nil, err
	}
	held, heldMACs := map[uint32]string{}, map[string]bool{}
	for _, e := range hs {
		if len(e.Key) >= 4 && len(e.Val) >= 6 {
			mac := net.HardwareAddr(e.Val[:6]).String()
			held[binary.NativeEndian.Uint32(e.Key)], heldMACs[mac] = mac, true
		}
	}
	expected, err := ExpectedMACs(id)
	if err != nil {
		return nil, err
	}
	maps.Copy(heldMACs, expected)
	var out []portGuard
	for _, e := range pms {
		if len(e.Key) < 10 {
			continue
		}
		index, mac := binary.NativeEndian.Uint32(e.Key), net.HardwareAddr(e.Key[4:10]).String()
		if held[index] != mac {
			// Its claim goes too, unless a port holds the MAC or is
			// expected to.
			out = append(out, portGuard{index: index, held: mac, keepClaim: heldMACs[mac]})
		}
	}
	return out, nil
}

// namedSets reads the sets of tbl that have these names, in that order,
// one request each; a missing one is left out.
func namedSets(conn *nftables.Conn, tbl *nftables.Table, names ...string) ([]*nftables.Set, error) {
	var out []*nftables.Set
	for _, name := range names {
		s, err := conn.GetSetByName(tbl, name)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// OwnsKey is an element of owns as netlink carries it: the MAC, padded to
// 8 bytes, then the port's name in IFNAMSIZ bytes.
func OwnsKey(p PortMAC) []byte {
	mac, _ := net.ParseMAC(p.MAC)
	k := make([]byte, 8+unix.IFNAMSIZ)
	copy(k, mac)
	copy(k[8:], p.Port)
	return k
}

// claimsChange is what ClaimPorts changes of the guard's sets.
type claimsChange struct {
	addOwns, delOwns         []PortMAC
	addClaimed, delClaimed   []string
	addExpected, delExpected []string
	evict                    []portGuard // MACs ports hold and must release
}

// empty tells whether ch changes nothing.
func (ch claimsChange) empty() bool {
	return len(ch.addOwns)+len(ch.delOwns)+len(ch.addClaimed)+len(ch.delClaimed)+len(ch.addExpected)+len(ch.delExpected)+len(ch.evict) == 0
}

// applyClaims makes the change, and removes the guards of the ports gone
// (expected is the expected MACs after the change: those stay claimed),
// in one netlink batch.
func applyClaims(id string, ch claimsChange, gone []portGuard, expected map[string]bool) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, g := range gone {
		g.keepClaim = expected[g.held]
		if err := addUnguard(conn, id, g); err != nil {
			return err
		}
	}
	if err := addClaims(conn, id, ch); err != nil {
		return err
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("network %q: claiming the VM ports' MACs: %w", id, err)
	}
	return nil
}

// addClaims adds change ch of the claims to conn's batch.
func addClaims(conn *nftables.Conn, id string, ch claimsChange) error {
	macElems := func(macs []string) []nftables.SetElement {
		var out []nftables.SetElement
		for _, m := range macs {
			if mac, err := net.ParseMAC(m); err == nil {
				out = append(out, nftables.SetElement{Key: mac})
			}
		}
		return out
	}
	ownsElems := func(ps []PortMAC) []nftables.SetElement {
		var out []nftables.SetElement
		for _, p := range ps {
			out = append(out, nftables.SetElement{Key: OwnsKey(p)})
		}
		return out
	}
	for _, op := range []struct {
		set  string
		add  bool
		elem []nftables.SetElement
	}{
		{SetOwns, false, ownsElems(ch.delOwns)},
		{SetOwns, true, ownsElems(ch.addOwns)},
		{SetExpected, false, macElems(ch.delExpected)},
		{SetExpected, true, macElems(ch.addExpected)},
		{SetClaimed, false, macElems(ch.delClaimed)},
		{SetClaimed, true, macElems(ch.addClaimed)},
	} {
		if len(op.elem) == 0 {
			continue
		}
		// A deletion adds first (a no-op if it is there): a batch made
		// from what was read a moment ago does not fail on an element
		// someone else removed since (hostnet.DeleteElement).
		s := guardSet(id, op.set)
		err := conn.SetAddElements(s, op.elem)
		if err == nil && !op.add {
			err = conn.SetDeleteElements(s, op.elem)
		}
		if err != nil {
			return err
		}
	}
	for _, g := range ch.evict {
		if err := addRelease(conn, id, g); err != nil {
			return err
		}
	}
	return nil
}

// Drops returns the frames each guarded port of network id dropped,
// by port name (its drop-counts element: the frames since its link was
// made). ports, if not nil, are the ports asked about: their elements
// alone are read, one request each, not the thousand of a fleet's
// network.
func Drops(_ context.Context, id string, ports []string) (map[string]uint64, error) {
	drops := map[string]uint64{}
	if ports != nil {
		for _, port := range ports {
			index, err := hostnet.LinkIndex(port)
			if err != nil || index == 0 {
				continue
			}
			e, err := hostnet.LookupElement(id, guardDropCounts, portKey(index))
			if err != nil {
				return drops, err
			}
			if e != nil {
				drops[port] = e.Packets
			}
		}
		return drops, nil
	}
	elems, err := SetElements(id, guardDropCounts)
	if err != nil || len(elems) == 0 {
		return drops, err
	}
	links, err := hostnet.OpenLinkNames()
	if err != nil {
		return drops, err
	}
	defer links.Close()
	for _, e := range elems {
		if len(e.Key) < 4 || e.Counter == nil {
			continue
		}
		if name, ok := links.NameOf(binary.NativeEndian.Uint32(e.Key)); ok && name != "" {
			drops[name] = e.Counter.Packets
		}
	}
	return drops, nil
}

// ensureGuardLayout makes n's guard table whole (ensureGuardTable) unless
// it is already (checkGuardChains): a port is guarded only by a table
// whose hook and rules are there.
func ensureGuardLayout(ctx context.Context, n *api.Network) error {
	if checkGuardChains(n) == nil {
		return nil
	}
	return EnsureTable(ctx, n)
}

// checkGuardChains tells what is wrong with the chains of n's guard
// table, nil if nothing: the hook must go to this version's chains, and
// each chain have as many rules as guardChains gives it.
func checkGuardChains(n *api.Network) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: hostnet.TableName(n.ID), Family: nftables.TableFamilyBridge}
	want := guardChains(n)
	for _, chain := range []string{guardHook, SetChecks, guardDropped, guardTunnelChain} {
		rules, err := conn.GetRules(tbl, &nftables.Chain{Name: chain})
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("chain %s (the ports' guard) does not exist", chain)
		}
		if err != nil {
			return fmt.Errorf("reading chain %s: %w", chain, err)
		}
		if len(rules) != len(want[chain]) {
			return fmt.Errorf("chain %s has %d rules, not the guard's %d", chain, len(rules), len(want[chain]))
		}
		if chain != guardHook {
			continue
		}
		// Each goes where it should: an older vmnetctl's hook (a
		// verdict map) has another number of rules, or other chains.
		for i, r := range rules {
			if !strings.Contains(want[chain][i], " goto ") {
				continue // (the partitions' drop)
			}
			if to := gotoChain(r); !strings.HasSuffix(want[chain][i], " goto "+to) || to == "" {
				return fmt.Errorf("chain %s: rule %d goes to %q, not as the guard's", chain, i+1, to)
			}
		}
	}
	return nil
}

// gotoChain is the chain rule r goes or jumps to, "" for none.
func gotoChain(r *nftables.Rule) string {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && v.Chain != "" {
			return v.Chain
		}
	}
	return ""
}

// v2Guard is what a guard table of version 2 holds: each port's chain,
// MAC set and counter, a template, and the ports' map.
type v2Guard struct {
	ports []string          // the ports with a chain
	held  map[string]string // port -> the MAC its set holds
	sets  map[string]bool   // the names of the table's sets
	chain bool              // v2Template is there
}

// readV2Guard reads what network id's guard table holds of version 2; nil
// when it holds nothing of it.
func readV2Guard(id string) (*v2Guard, error) {
	chains, err := hostnet.TableChains(knftables.BridgeFamily, hostnet.TableName(id))
	if err != nil {
		return nil, err
	}
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: hostnet.TableName(id), Family: nftables.TableFamilyBridge}
	sets, err := conn.GetSets(tbl)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network %q: reading the guard's sets: %w", id, err)
	}
	old := &v2Guard{held: map[string]string{}, sets: map[string]bool{}}
	for _, s := range sets {
		old.sets[s.Name] = true
	}
	for _, c := range chains {
		old.chain = old.chain || c == v2Template
		port, ok := strings.CutPrefix(c, v2ChainOf)
		if !ok {
			continue
		}
		old.ports = append(old.ports, port)
		elems, err := SetElements(id, v2MACSetOf+port)
		if err != nil {
			return nil, err
		}
		for _, e := range elems {
			if len(e.Key) >= 6 {
				old.held[port] = net.HardwareAddr(e.Key[:6]).String()
			}
		}
	}
	if len(old.ports) == 0 && !old.sets[v2Ports] && !old.sets[v2Current] && !old.sets[v2TemplateMA] && !old.chain {
		return nil, nil
	}
	return old, nil
}

// migrate adds to tx, after the new layout (addGuardLayout, whose hook no
// longer uses the ports' map), the guards of old's ports that exist in
// this version's sets, with the MACs they held, and the deletion of what
// was version 2's: the map first (its elements jump to the ports' chains),
// then each port's chain, set and counter, then the rest.
func (old *v2Guard) migrate(tx *knftables.Transaction) {
	for _, port := range old.ports {
		index, err := hostnet.LinkIndex(port)
		if err != nil || index == 0 {
			continue
		}
		idx := strconv.FormatUint(uint64(index), 10)
		tx.Add(&knftables.Element{Set: SetGuarded, Key: []string{idx}})
		if mac := old.held[port]; mac != "" {
			tx.Add(&knftables.Element{Map: SetHeld, Key: []string{idx}, Value: []string{mac}})
			tx.Add(&knftables.Element{Set: SetPortMACs, Key: []string{idx, mac}})
		}
	}
	if old.sets[v2Ports] {
		tx.Delete(&knftables.Map{Name: v2Ports})
	}
	for _, port := range old.ports {
		tx.Delete(&knftables.Chain{Name: v2ChainOf + port})
		if old.sets[v2MACSetOf+port] {
			tx.Delete(&knftables.Set{Name: v2MACSetOf + port})
		}
		tx.Add(&knftables.Counter{Name: v2CounterOf + port})
		tx.Delete(&knftables.Counter{Name: v2CounterOf + port})
	}
	if old.chain {
		tx.Delete(&knftables.Chain{Name: v2Template})
	}
	if old.sets[v2TemplateMA] {
		tx.Delete(&knftables.Set{Name: v2TemplateMA})
		tx.Add(&knftables.Counter{Name: v2TemplateCo})
		tx.Delete(&knftables.Counter{Name: v2TemplateCo})
	}
	if old.sets[v2Current] {
		tx.Delete(&knftables.Set{Name: v2Current})
	}
}

// GuardedPorts returns the interface indexes of the ports network id's
// guard checks.
func GuardedPorts(id string) (map[uint32]bool, error) {
	elems, err := SetElements(id, SetGuarded)
	out := map[uint32]bool{}
	for _, e := range elems {
		if len(e.Key) >= 4 {
			out[binary.NativeEndian.Uint32(e.Key)] = true
		}
	}
	return out, err
}
