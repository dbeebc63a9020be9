package spec

import (
	"fmt"
	"slices"
)

// SuggestVM is "; VMs that are up: [...]" for a VM name that is not up.
func SuggestVM(d *Desired, vm string) string {
	names := VMNamesOf(d)
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("; VMs that are up: %v", names)
}

// VMNamesOf returns the VMs of a desired state, sorted.
func VMNamesOf(d *Desired) []string {
	var names []string
	for _, a := range d.Attachments {
		if !slices.Contains(names, a.VM) {
			names = append(names, a.VM)
		}
	}
	slices.Sort(names)
	return names
}
