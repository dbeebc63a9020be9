package ops

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Validation is what `vmnetctl validate` found valid.
type Validation struct {
	Networks *api.Networks
	Files    []*api.VMFile
}

// Validate is `vmnetctl validate`: it parses networks.yaml and the VM files
// of in and resolves them against each other, reporting every problem at
// once (the VM files are read even when networks.yaml has errors), and warns
// about what backendName cannot honour. It changes nothing.
func Validate(env Env, in *Input, backendName string) (*Validation, error) {
	be, err := backends.ByName(backendName)
	if err != nil {
		return nil, err
	}
	nets, pp, diags := validateFiles(in)
	env.warn(diags)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	if err := env.StateDir.CheckSocketPaths(pp.Files); err != nil {
		return nil, err
	}
	var atts []*api.Attachment
	for _, vf := range pp.Files {
		for _, vm := range vf.VMs {
			atts = append(atts, vm.Attachments...)
		}
	}
	refused := 0
	for _, l := range be.Limits(nets.Networks, atts) {
		if l.Refused {
			refused++
			fmt.Fprintln(env.Stderr, "error:", l.Message)
		} else {
			fmt.Fprintln(env.Stderr, "warning:", l.Message)
		}
	}
	if refused > 0 {
		return nil, fmt.Errorf("%d setting%s the %s backend would refuse (above)", refused, plural(refused), be.Name())
	}
	return &Validation{Networks: nets, Files: pp.Files}, nil
}

// validateFiles parses networks.yaml and the VM files of in and resolves
// them against each other: every problem, at once.
func validateFiles(in *Input) (*api.Networks, spec.ParsedProject, api.Diagnostics) {
	nets, diags := api.LoadNetworks(in.Networks.Source, in.Networks.Data)
	pp, fdiags := spec.ParseProject(&statedir.Project{Files: in.Files, VMName: in.VMName})
	diags = append(diags, fdiags...)
	if nets != nil {
		diags = append(diags, api.Resolve(nets, pp.Files)...)
		return nets, pp, diags
	}
	// networks.yaml has errors: the VM files are checked all the same,
	// against the networks that load, their entries on a network with
	// errors left out (what they would resolve to is unknown), on copies.
	valid, broken := api.NetworksThatLoad(in.Networks.Source, in.Networks.Data)
	if valid != nil {
		diags = append(diags, api.Resolve(valid, withoutNetworks(pp.Files, broken))...)
	}
	return nil, pp, diags
}

// withoutNetworks is copies of files without their entries on the
// networks named.
func withoutNetworks(files []*api.VMFile, names []string) []*api.VMFile {
	out := make([]*api.VMFile, 0, len(files))
	for _, f := range files {
		c := f.Clone()
		for _, vm := range c.VMs {
			vm.Attachments = slices.DeleteFunc(vm.Attachments, func(a *api.Attachment) bool {
				return (a.Ref == api.RefVMNet || a.Ref == api.RefLima) && slices.Contains(names, a.NetworkRef)
			})
		}
		out = append(out, c)
	}
	return out
}

// ValidationReport is `vmnetctl validate --json`: every problem of the
// files (and what the backend would refuse or not honour), each as an
// object, and what is valid.
type ValidationReport struct {
	Valid       bool                  `json:"valid"`
	Problems    []ValidationProblem   `json:"problems"`
	Networks    int                   `json:"networks"`
	Attachments []ValidatedAttachment `json:"attachments"`
	// Skipped are the entries vmnetctl leaves to others (a network it
	// does not manage), as the text lists them.
	Skipped []SkippedEntry `json:"skipped"`
}

// SkippedEntry is one VM's entry that vmnetctl does not manage, and why.
type SkippedEntry struct {
	VM     string `json:"vm"`
	Index  int    `json:"index"`
	Entry  string `json:"entry"`
	Reason string `json:"reason"`
}

// ValidationProblem is one problem: FILE:LINE: field: message.
type ValidationProblem struct {
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Field    string `json:"field,omitempty"`
	Message  string `json:"message"`
	Severity string `json:"severity"` // error or warning
}

// ValidatedAttachment is one VM attachment the files define.
type ValidatedAttachment struct {
	VM        string `json:"vm"`
	Network   string `json:"network"`
	MAC       string `json:"mac"`
	Attach    string `json:"attach"`
	IP        string `json:"ip,omitempty"`
	Interface string `json:"interface,omitempty"`
}

// ValidateReport is Validate as a report: the files' problems are in it,
// not an error (which is only for what kept it from looking: an unknown
// backend).
func ValidateReport(env Env, in *Input, backendName string) (*ValidationReport, error) {
	be, err := backends.ByName(backendName)
	if err != nil {
		return nil, err
	}
	nets, pp, diags := validateFiles(in)
	r := &ValidationReport{Problems: []ValidationProblem{}, Attachments: []ValidatedAttachment{}, Skipped: []SkippedEntry{}}
	// In file and line order, as the text lists them: the resolver's
	// problems come after the parser's.
	for _, d := range diags.Sorted() {
		sev := "error"
		if d.Severity == api.SeverityWarning {
			sev = "warning"
		}
		r.Problems = append(r.Problems, ValidationProblem{File: d.File, Line: d.Line, Field: d.Field, Message: d.Message, Severity: sev})
	}
	r.Valid = diags.Err() == nil
	if !r.Valid {
		return r, nil
	}
	if err := env.StateDir.CheckSocketPaths(pp.Files); err != nil {
		r.Valid = false
		r.Problems = append(r.Problems, ValidationProblem{Message: err.Error(), Severity: "error"})
		return r, nil
	}
	var atts []*api.Attachment
	for _, vf := range pp.Files {
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				atts = append(atts, a)
				va := ValidatedAttachment{VM: vm.Name, Network: a.Network, MAC: a.MAC, Attach: string(a.Attach), Interface: a.Interface}
				if a.IP.IsValid() {
					va.IP = a.IP.String()
				}
				r.Attachments = append(r.Attachments, va)
			}
			for _, sk := range vm.Skipped {
				r.Skipped = append(r.Skipped, SkippedEntry{VM: vm.Name, Index: sk.Index, Entry: sk.Entry, Reason: sk.Reason})
			}
		}
	}
	r.Networks = len(nets.Networks)
	for _, l := range be.Limits(nets.Networks, atts) {
		sev := "warning"
		if l.Refused {
			sev, r.Valid = "error", false
		}
		r.Problems = append(r.Problems, ValidationProblem{Message: l.Message, Severity: sev})
	}
	return r, nil
}

// Render writes what is valid and every VM attachment, as a table.
func (v *Validation) Render(w io.Writer) error {
	nets := v.Networks
	fmt.Fprintf(w, "%s: %d network%s, valid\n", nets.Source, len(nets.Networks), plural(len(nets.Networks)))
	for _, vf := range v.Files {
		fmt.Fprintf(w, "%s: %d VM%s, valid\n", vf.File, len(vf.VMs), plural(len(vf.VMs)))
	}
	if len(v.Files) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tNETWORK\tMAC\tATTACH\tIP\tINTERFACE")
	for _, vf := range v.Files {
		for _, vm := range vf.VMs {
			for _, a := range vm.Attachments {
				ip := "dhcp"
				if a.IP.IsValid() {
					ip = a.IP.String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", vm.Name, a.Network, a.MAC, a.Attach, ip, a.Interface)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, vf := range v.Files {
		for _, vm := range vf.VMs {
			for _, sk := range vm.Skipped {
				fmt.Fprintf(w, "%s: skipping entry %d (%s): %s\n", vm.Name, sk.Index, sk.Entry, sk.Reason)
			}
		}
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
