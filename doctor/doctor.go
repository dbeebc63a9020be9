// Package doctor checks what vmnetctl needs on this host and what commonly
// breaks VM networks on a real one (`vmnetctl doctor`): each finding says
// what to do. Preflight is the cheap part that `up` runs first.
package doctor

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/vmnetctl/vmnetctl/api"
)

// Status is a finding's verdict.
type Status string

const (
	OK   Status = "ok"
	Info Status = "info" // worth knowing, changes nothing
	Warn Status = "warn" // works, but something will likely break
	Fail Status = "fail" // vmnetctl cannot work until this is fixed
)

// Finding is one check's result.
type Finding struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	// Fix says what to do; empty when there is nothing to do.
	Fix string `json:"fix,omitempty"`
}

// Report is every check's finding.
type Report struct {
	Findings []Finding `json:"findings"`
	// Problems counts the findings that warn or fail.
	Problems int `json:"problems"`
}

func (r *Report) add(f Finding) {
	r.Findings = append(r.Findings, f)
	if f.Status == Warn || f.Status == Fail {
		r.Problems++
	}
}

// Render writes the report as a table, then each fix.
func (r *Report) Render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Check, f.Status, f.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Findings {
		if f.Fix != "" && f.Status != OK {
			fmt.Fprintf(w, "\n%s (%s): %s\n", f.Check, f.Status, f.Fix)
		}
	}
	if r.Problems == 0 {
		fmt.Fprintln(w, "\nNo problems found.")
	} else {
		noun := "problems"
		if r.Problems == 1 {
			noun = "problem"
		}
		fmt.Fprintf(w, "\n%d %s found.\n", r.Problems, noun)
	}
	return nil
}

// Run makes every check for the networks of networks.yaml.
func Run(ctx context.Context, nets []*api.Network) *Report {
	r := &Report{Findings: []Finding{}}
	for _, c := range checks() {
		for _, f := range c(ctx, nets) {
			r.add(f)
		}
	}
	return r
}

// check is one kind of check; it may give several findings (one per
// network, per kernel feature).
type check func(ctx context.Context, nets []*api.Network) []Finding

// Preflight runs the cheap checks that decide whether vmnetctl can work at
// all here, and returns the first failure in the words doctor uses, or nil.
func Preflight(ctx context.Context) error {
	for _, c := range preflight() {
		for _, f := range c(ctx, nil) {
			if f.Status == Fail {
				return fmt.Errorf("%s: %s; %s (see `vmnetctl doctor`)", f.Check, f.Detail, f.Fix)
			}
		}
	}
	return nil
}
