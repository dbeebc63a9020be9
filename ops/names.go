package ops

import (
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// ProjectNames returns the projects of sd, for shell completion.
func ProjectNames(sd statedir.Dir) []string {
	ps, _ := sd.Projects()
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	return names
}

// DefinedNetworks returns the networks vmnetctl runs of the networks of
// record, else of networksPath (or as config.ReadNetworks finds it), for
// shell completion of a network that is not up yet; nothing when it
// cannot tell.
func DefinedNetworks(sd statedir.Dir, networksPath string) []string {
	in, err := ReadInput(networksPath, nil, "", "")
	if err != nil {
		return nil
	}
	nets, err := networksOf(Env{StateDir: sd}, in)
	if err != nil {
		return nil
	}
	var ids []string
	for _, n := range nets.Networks {
		if n.Managed() {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// Names returns the VMs and networks that are up in sd, for shell
// completion; nothing when it cannot tell.
func Names(sd statedir.Dir) (vms, networks []string) {
	d, err := spec.AppliedState(sd)
	if err != nil {
		return nil, nil
	}
	for _, n := range d.Networks {
		networks = append(networks, n.ID)
	}
	return spec.VMNamesOf(d), networks
}
