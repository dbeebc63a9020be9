package netplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vmnetctl/vmnetctl/api"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// A port's guard is made in this process, through netlink, by copying a
// template: the network's guard table holds an inert chain of a learning
// port's rules (never jumped to), made with nft when the network starts
// (ensureGuardTable), and GuardPort copies its rules, expression by
// expression, into the new port's chain, with the port's own MAC set and
// drop counter named in place of the template's. nft itself reads the
// whole table before each command, every port's chain with it: 0.3 s a
// command with 1,000 ports, so a port's guard cost more with every port
// already there. The copy costs three netlink requests however many ports
// there are. TestGuardClone checks that a copied chain lists exactly as
// nft makes it from portRules.
const (
	guardTemplate        = "tmpl-port"  // not port-*: pruneGuards leaves it
	guardTemplateMACSet  = "tmpl-mac"   // not mac-*: no port's
	guardTemplateCounter = "tmpl-drops" // not drops-*: counted for no port
)

// addGuardTemplate adds to tx the template of n's ports' chains, made
// again from portRules.
func addGuardTemplate(tx *knftables.Transaction, n *api.Network) {
	tx.Add(&knftables.Set{Name: guardTemplateMACSet, Type: "ether_addr", Size: knftables.PtrTo(uint64(1)),
		Flags: []knftables.SetFlag{knftables.DynamicFlag}})
	tx.Add(&knftables.Counter{Name: guardTemplateCounter})
	tx.Add(&knftables.Chain{Name: guardTemplate})
	tx.Flush(&knftables.Chain{Name: guardTemplate})
	for _, r := range guardRules(n, guardTemplateMACSet, guardTemplateCounter, true) {
		tx.Add(&knftables.Rule{Chain: guardTemplate, Rule: r})
	}
}

// errNoTemplate: the network's guard table has no template (made by an
// older vmnetctl, or being made again): GuardPort uses nft.
var errNoTemplate = errors.New("the guard table has no template chain")

// guardPortByClone is GuardPort's transaction for a learning port (mac
// nil) of network n, through netlink: port's old guard is kept if it is
// reusable; else it goes (the MAC it held leaves claimed unless ps says
// it is some port's expected MAC) and its new one is copied from the
// template, in one batch.
func guardPortByClone(n *api.Network, port string, ps portState) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: TableName(n.ID), Family: nftables.TableFamilyBridge}
	tmpl, err := conn.GetRules(tbl, &nftables.Chain{Name: guardTemplate})
	// A template with other rules than n's (changed behind vmnetctl's
	// back, or left by another version) is not copied: nft makes the
	// guard from the code's rules instead.
	if errors.Is(err, unix.ENOENT) || err == nil && len(tmpl) != len(guardRules(n, guardTemplateMACSet, guardTemplateCounter, true)) {
		return errNoTemplate
	}
	if err != nil {
		return fmt.Errorf("network %q: reading the guard's template: %w", n.ID, err)
	}
	// (A table the template is in has every set of addGuardBase.)
	sets, err := guardNLSets(conn, tbl, n.ID)
	if err != nil {
		return err
	}
	o := guardObjectsNL(tbl, port)
	macSet, counter, chain, jump := o.set, o.counter, o.chain, o.jump
	if reusable(n.ID, o, len(tmpl), ps) {
		conn.SetAddElements(sets[guardPorts], []nftables.SetElement{jump})
		if err := conn.Flush(); err != nil {
			return fmt.Errorf("network %q: guarding port %s: %w", n.ID, port, err)
		}
		return nil
	}
	// The old guard, if there is one: deleting a chain or a set makes
	// the kernel's commit wait for its readers (10 to 20 ms here), which
	// a new port need not pay.
	if ps.exists() {
		o.delete(conn, sets, ps.held, ps.heldExpected)
	}

	// The new one.
	if err := conn.AddSet(macSet, nil); err != nil {
		return err
	}
	conn.AddObj(counter)
	conn.AddChain(chain)
	for _, r := range tmpl {
		exprs := make([]expr.Any, 0, len(r.Exprs))
		for _, e := range r.Exprs {
			exprs = append(exprs, renameInExpr(e, macSet.Name, counter.Name))
		}
		conn.AddRule(&nftables.Rule{Table: tbl, Chain: chain, Exprs: exprs})
	}
	conn.SetAddElements(sets[guardPorts], []nftables.SetElement{jump})
	conn.SetAddElements(sets[guardCurrent], []nftables.SetElement{{Key: o.key}})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("network %q: guarding port %s: %w", n.ID, port, err)
	}
	return nil
}

// reusable tells whether the old guard of a learning port (o, on network
// id; ps what it holds) can serve the port's new VM as it is: whole (its
// set, and its chain with as many rules as the template), made with this
// version's rules (in current), and holding no MAC but the one the port
// owns, which the new VM would learn anyway. Reusing it adds an element;
// replacing it deletes a chain and a set, and the commit then waits for
// the kernel's readers (10 to 20 ms here): a VM attached again under its
// name (a fleet's runner, a restarted helper) is guarded at once.
func reusable(id string, o guardNL, rules int, ps portState) bool {
	if !ps.set || ps.rules != rules || ps.held != "" && !ps.heldOwned {
		return false
	}
	current, err := hasElement(id, guardCurrent, o.key)
	return err == nil && current
}

// guardNL is a port's guard objects as netlink writes them (guardObjects
// is the same for nft).
type guardNL struct {
	set     *nftables.Set
	counter *nftables.CounterObj
	chain   *nftables.Chain
	key     []byte              // the port's name, as the maps' keys hold it
	jump    nftables.SetElement // the ports map's element: key -> jump chain
}

func guardObjectsNL(tbl *nftables.Table, port string) guardNL {
	key := make([]byte, unix.IFNAMSIZ)
	copy(key, port)
	chain := &nftables.Chain{Table: tbl, Name: guardChain(port)}
	return guardNL{
		set:     &nftables.Set{Table: tbl, Name: guardMACSet(port), KeyType: nftables.TypeEtherAddr, Dynamic: true, Size: 1},
		counter: &nftables.CounterObj{Table: tbl, Name: guardCounter(port)},
		chain:   chain,
		key:     key,
		jump:    nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain.Name}},
	}
}

// guardNLSets reads the sets a port's guard is made and deleted in
// (guardNL.delete, guardPortByClone): the ports map, claimed, current.
func guardNLSets(conn *nftables.Conn, tbl *nftables.Table, id string) (map[string]*nftables.Set, error) {
	sets := map[string]*nftables.Set{}
	for _, name := range []string{guardPorts, guardClaimed, guardCurrent} {
		set, err := conn.GetSetByName(tbl, name)
		if err != nil {
			return nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, name, err)
		}
		sets[name] = set
	}
	return sets, nil
}

// delete adds to conn's batch the deletion of the guard, existing or not,
// its drop counter kept (deleteGuard, through netlink): each object is
// added first (a no-op if it is there), so that its deletion finds it.
// The map's element goes first (it jumps to the chain), then the chain
// with its rules (which use the set), then the set. The MAC the port held
// (held, "" for none) leaves claimed unless it is some port's expected
// MAC (heldExpected).
func (o guardNL) delete(conn *nftables.Conn, sets map[string]*nftables.Set, held string, heldExpected bool) {
	if held != "" && !heldExpected {
		if mac, err := net.ParseMAC(held); err == nil {
			conn.SetAddElements(sets[guardClaimed], []nftables.SetElement{{Key: mac}})
			conn.SetDeleteElements(sets[guardClaimed], []nftables.SetElement{{Key: mac}})
		}
	}
	conn.AddSet(o.set, nil)
	conn.AddChain(o.chain)
	conn.SetAddElements(sets[guardPorts], []nftables.SetElement{o.jump})
	conn.SetDeleteElements(sets[guardPorts], []nftables.SetElement{{Key: o.key}})
	conn.SetAddElements(sets[guardCurrent], []nftables.SetElement{{Key: o.key}})
	conn.SetDeleteElements(sets[guardCurrent], []nftables.SetElement{{Key: o.key}})
	conn.DelChain(o.chain)
	conn.DelSet(o.set)
}

// pruneGuardsNL removes the guards of ports, whose links are gone, and
// their drop counters, in one netlink batch: a commit that deletes waits
// for the kernel's readers (10 to 20 ms here), once for the batch rather
// than once a port, so a `down` of a thousand VMs prunes in one wait.
// Each port's part starts with the deletion of its chain's first rule by
// its handle, so that the batch fails, and a new guard stays, should a new
// port of the name have been guarded since (a new chain, new handles);
// the ports are then pruned one batch each, and only the one that lost
// the race keeps its guard. expected is the guard's expected MACs.
func pruneGuardsNL(id string, ports []string, expected map[string]bool) error {
	if len(ports) > pruneChunk {
		// A batch and its acknowledgements must fit the socket's
		// buffers (applyChunk): a thousand ports go in batches.
		for chunk := range slices.Chunk(ports, pruneChunk) {
			if err := pruneGuardsNL(id, chunk, expected); err != nil {
				return err
			}
		}
		return nil
	}
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: TableName(id), Family: nftables.TableFamilyBridge}
	sets, err := guardNLSets(conn, tbl, id)
	if err != nil {
		return err
	}
	n := 0
	for _, port := range ports {
		ok, err := addPrune(conn, tbl, sets, id, port, expected)
		if err != nil {
			return err
		}
		if ok {
			n++
		}
	}
	if n == 0 || conn.Flush() == nil || len(ports) == 1 {
		return nil // (one port that lost its race: its guard stays)
	}
	for _, port := range ports {
		if err := pruneGuardsNL(id, []string{port}, expected); err != nil {
			return err
		}
	}
	return nil
}

// pruneChunk is the most ports whose guards one batch of pruneGuardsNL
// deletes (some ten messages each).
const pruneChunk = 16

// addPrune adds to conn's batch the removal of port's guard (pruneGuardsNL);
// false if it has none, or no rule (gone already, or never finished).
func addPrune(conn *nftables.Conn, tbl *nftables.Table, sets map[string]*nftables.Set, id, port string, expected map[string]bool) (bool, error) {
	o := guardObjectsNL(tbl, port)
	rules, err := conn.GetRules(tbl, o.chain)
	if err != nil || len(rules) == 0 {
		return false, nil
	}
	held, err := readHeld(id, port)
	if err != nil {
		return false, err
	}
	if err := conn.DelRule(&nftables.Rule{Table: tbl, Chain: o.chain, Handle: rules[0].Handle}); err != nil {
		return false, err
	}
	o.delete(conn, sets, held, expected[held])
	conn.AddObj(o.counter)
	conn.DeleteObject(o.counter)
	return true, nil
}

// renameInExpr is e, or a copy of it that names macSet and counter where
// e names the template's.
func renameInExpr(e expr.Any, macSet, counter string) expr.Any {
	switch x := e.(type) {
	case *expr.Lookup:
		if x.SetName == guardTemplateMACSet {
			y := *x
			y.SetName, y.SetID = macSet, 0
			return &y
		}
	case *expr.Dynset:
		if x.SetName == guardTemplateMACSet {
			y := *x
			y.SetName, y.SetID = macSet, 0
			return &y
		}
	case *expr.Objref:
		if x.Name == guardTemplateCounter {
			y := *x
			y.Name = counter
			return &y
		}
	}
	return e
}

// readHeld reads the MAC port's set holds on network id, through netlink;
// "" for none or no set.
func readHeld(id, port string) (string, error) {
	elems, err := guardSetElements(id, guardMACSet(port))
	for _, e := range elems {
		if len(e.Key) >= 6 {
			return net.HardwareAddr(e.Key[:6]).String(), nil
		}
	}
	return "", err
}

// guardParts reads what port's guard on network id has of its own: its
// MAC set, and the rules of its chain (0 without the chain).
func guardParts(id, port string) (set bool, rules int, err error) {
	conn, err := nftables.New()
	if err != nil {
		return false, 0, fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: TableName(id), Family: nftables.TableFamilyBridge}
	_, err = conn.GetSetByName(tbl, guardMACSet(port))
	switch {
	case err == nil:
		set = true
	case !errors.Is(err, unix.ENOENT):
		return false, 0, fmt.Errorf("network %q: looking for the guard of port %s: %w", id, port, err)
	}
	have, err := conn.GetRules(tbl, &nftables.Chain{Name: guardChain(port)})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return false, 0, fmt.Errorf("network %q: looking for the guard of port %s: %w", id, port, err)
	}
	return set, len(have), nil
}

// guardSetElements reads the elements of set name of network id's guard
// table through netlink (one small request, whatever else the table
// holds); none without the set or the table.
func guardSetElements(id, name string) ([]nftables.SetElement, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	set, err := conn.GetSetByName(&nftables.Table{Name: TableName(id), Family: nftables.TableFamilyBridge}, name)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err == nil {
		var elems []nftables.SetElement
		if elems, err = conn.GetSetElements(set); err == nil {
			return elems, nil
		}
	}
	return nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, name, err)
}

// readGuardStateNL reads the MACs of network id's guard table through
// netlink: the sets' definitions, then the elements of owns, claimed,
// expected and, with learned, each port's MAC set (one small request
// each). All empty without the table.
func readGuardStateNL(id string, learned bool) (*guardState, map[string]*nftables.Set, error) {
	st := &guardState{learned: map[string]string{}, claimed: map[string]bool{}, owns: map[portMAC]bool{}, expectedMACs: map[string]bool{}}
	conn, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	tbl := &nftables.Table{Name: TableName(id), Family: nftables.TableFamilyBridge}
	var all []*nftables.Set
	if learned {
		all, err = conn.GetSets(tbl)
	} else {
		// Those sets alone, not every port's with them.
		all, err = namedSets(conn, tbl, guardClaimed, guardOwns, guardExpected, guardPorts, guardCurrent)
	}
	if errors.Is(err, unix.ENOENT) {
		return st, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("network %q: reading the guard's sets: %w", id, err)
	}
	sets := map[string]*nftables.Set{}
	for _, s := range all {
		port, isPort := strings.CutPrefix(s.Name, guardMACSet(""))
		switch {
		case s.Name == guardClaimed || s.Name == guardOwns || s.Name == guardExpected:
		case s.Name == guardPorts || s.Name == guardCurrent:
			sets[s.Name] = s // (to prune guards in the same batch)
			continue
		case isPort:
			sets[s.Name] = s
			if !learned {
				continue
			}
		default:
			continue
		}
		sets[s.Name] = s
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return nil, nil, fmt.Errorf("network %q: reading the guard's set %s: %w", id, s.Name, err)
		}
		for _, e := range elems {
			if len(e.Key) < 6 {
				continue
			}
			mac := net.HardwareAddr(e.Key[:6]).String()
			switch {
			case s.Name == guardClaimed:
				st.claimed[mac] = true
			case s.Name == guardExpected:
				st.expectedMACs[mac] = true
			case s.Name == guardOwns && len(e.Key) >= 8+unix.IFNAMSIZ:
				st.owns[portMAC{mac, string(bytes.TrimRight(e.Key[8:8+unix.IFNAMSIZ], "\x00"))}] = true
			case isPort:
				st.learned[port] = mac
			}
		}
	}
	return st, sets, nil
}

// namedSets reads the sets of tbl that have these names, one request
// each; a missing one is left out.
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

// ownsKey is an element of owns as netlink carries it: the MAC, padded to
// 8 bytes, then the port's name in IFNAMSIZ bytes.
func ownsKey(p portMAC) []byte {
	mac, _ := net.ParseMAC(p.mac)
	k := make([]byte, 8+unix.IFNAMSIZ)
	copy(k, mac)
	copy(k[8:], p.port)
	return k
}

// claimsChange is what ClaimPorts changes of the guard's sets.
type claimsChange struct {
	addOwns, delOwns         []portMAC
	addClaimed, delClaimed   []string
	addExpected, delExpected []string
	evict                    []portMAC
}

// empty tells whether ch changes nothing.
func (ch claimsChange) empty() bool {
	return len(ch.addOwns)+len(ch.delOwns)+len(ch.addClaimed)+len(ch.delClaimed)+len(ch.addExpected)+len(ch.delExpected)+len(ch.evict) == 0
}

// applyClaims makes the change, and removes the guards of the ports gone
// (addPrune; expected is the expected MACs after the change), in one
// netlink batch. Should that batch fail because a new port of a gone name
// was guarded meanwhile, the change is made alone and the guards pruned
// one by one (pruneGuardsNL), the new port's kept.
func applyClaims(id string, sets map[string]*nftables.Set, ch claimsChange, gone []string, expected map[string]bool) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	pruned := 0
	if sets[guardPorts] != nil && sets[guardCurrent] != nil && sets[guardClaimed] != nil {
		tbl := &nftables.Table{Name: TableName(id), Family: nftables.TableFamilyBridge}
		for _, port := range gone {
			ok, err := addPrune(conn, tbl, sets, id, port, expected)
			if err != nil {
				return err
			}
			if ok {
				pruned++
			}
		}
	}
	if err := addClaims(conn, id, sets, ch); err != nil {
		return err
	}
	err = conn.Flush()
	if err != nil && pruned > 0 {
		// A gone name's new guard: the change alone, the guards one by one.
		if err := applyClaims(id, sets, ch, nil, nil); err != nil {
			return err
		}
		return pruneGuardsNL(id, gone, expected)
	}
	if err != nil {
		return fmt.Errorf("network %q: claiming the VM ports' MACs: %w", id, err)
	}
	return nil
}

// addClaims adds change ch of the claims to conn's batch.
func addClaims(conn *nftables.Conn, id string, sets map[string]*nftables.Set, ch claimsChange) error {
	macElems := func(macs []string) []nftables.SetElement {
		var out []nftables.SetElement
		for _, m := range macs {
			if mac, err := net.ParseMAC(m); err == nil {
				out = append(out, nftables.SetElement{Key: mac})
			}
		}
		return out
	}
	ownsElems := func(ps []portMAC) []nftables.SetElement {
		var out []nftables.SetElement
		for _, p := range ps {
			out = append(out, nftables.SetElement{Key: ownsKey(p)})
		}
		return out
	}
	for _, op := range []struct {
		set  string
		add  bool
		elem []nftables.SetElement
	}{
		{guardOwns, false, ownsElems(ch.delOwns)},
		{guardOwns, true, ownsElems(ch.addOwns)},
		{guardExpected, false, macElems(ch.delExpected)},
		{guardExpected, true, macElems(ch.addExpected)},
		{guardClaimed, false, macElems(ch.delClaimed)},
		{guardClaimed, true, macElems(ch.addClaimed)},
	} {
		s := sets[op.set]
		if len(op.elem) == 0 {
			continue
		}
		if s == nil {
			return fmt.Errorf("network %q: the guard has no set %s", id, op.set)
		}
		// A deletion adds first (a no-op if it is there): a batch made
		// from what was read a moment ago does not fail on an element
		// someone else removed since (deleteElement).
		err := conn.SetAddElements(s, op.elem)
		if err == nil && !op.add {
			err = conn.SetDeleteElements(s, op.elem)
		}
		if err != nil {
			return err
		}
	}
	for _, p := range ch.evict {
		if s := sets[guardMACSet(p.port)]; s != nil {
			if err := conn.SetDeleteElements(s, macElems([]string{p.mac})); err != nil {
				return err
			}
		}
	}
	return nil
}
