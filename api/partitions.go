package api

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Partitions cut a network in groups of VMs, by name: no frame passes
// between VMs of two groups (a network partition, to test what runs
// across them), and a VM in no group reaches them all. A network's
// `partitions: [[a, b], [c]]`.
type Partitions [][]string

// String is the groups as a VM file writes them: "[a, b], [c]".
func (p Partitions) String() string {
	groups := make([]string, len(p))
	for i, g := range p {
		groups[i] = "[" + strings.Join(g, ", ") + "]"
	}
	return strings.Join(groups, ", ")
}

// Group is the index of vm's group, -1 for none.
func (p Partitions) Group(vm string) int {
	for i, g := range p {
		if slices.ContainsFunc(g, func(s string) bool { return strings.EqualFold(s, vm) }) {
			return i
		}
	}
	return -1
}

// partitions reads a network's `partitions:`: a list of groups, each a
// list of VM names, no VM in two.
func (w *walker) partitions(v *yaml.Node, path string) Partitions {
	if v.Kind != yaml.SequenceNode {
		w.errorf(v, path, "must be a list of groups of VM names like [[a, b], [c]], not %s", kindName(v))
		return nil
	}
	var out Partitions
	seen := map[string]string{} // lower-case name -> its place
	for i, g := range v.Content {
		g = deref(g)
		gp := fmt.Sprintf("%s[%d]", path, i)
		if g.Kind != yaml.SequenceNode || len(g.Content) == 0 {
			w.errorf(g, gp, "must be a list of VM names, not %s", kindName(g))
			continue
		}
		var group []string
		for j, n := range g.Content {
			np := fmt.Sprintf("%s[%d]", gp, j)
			s, ok := w.str(deref(n), np)
			if !ok {
				continue
			}
			if msg := checkVMName(s); msg != "" {
				w.errorf(n, np, "VM name %s", msg)
				continue
			}
			if prev, dup := seen[strings.ToLower(s)]; dup {
				w.errorf(n, np, "VM %q is in two groups (also at %s): a VM is on one side of a partition", s, prev)
				continue
			}
			seen[strings.ToLower(s)] = np
			group = append(group, s)
		}
		out = append(out, group)
	}
	if len(out) < 2 && len(w.diags.Errors()) == 0 {
		w.errorf(v, path, "cuts nothing: give two groups or more, like [[a, b], [c]]")
	}
	return out
}
