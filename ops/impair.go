package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// ImpairOptions are `vmnetctl impair`'s: the VM (and its network, for a
// VM on several), and what its link does: Impair (nil: nothing at all),
// or with Clear, its VM file's again.
type ImpairOptions struct {
	VM, Network string
	Impair      *api.Impairment
	Clear       bool
	Out         io.Writer
}

// Impair sets what a running VM's link does to its frames (loses,
// delays, duplicates, reorders), in place of its VM file's
// impair, until Clear (the controller records it: a later `up` keeps it,
// and says how it differs from the file), and prints the attachment's
// line once it applies.
func Impair(ctx context.Context, sd statedir.Dir, o ImpairOptions) error {
	cl := NewClient(sd)
	if !cl.Running(ctx) {
		return fmt.Errorf("no controller runs for %s: nothing is attached to impair", sd.Path)
	}
	body, err := json.Marshal(ctlapi.ImpairRequest{VM: o.VM, Network: o.Network, Impair: o.Impair, Clear: o.Clear})
	if err != nil {
		return err
	}
	var resp ctlapi.ReconcileResponse
	if status, err := cl.call(ctx, http.MethodPost, "/v1/impair", body, &resp); err != nil {
		if _, msg, ok := strings.Cut(err.Error(), http.StatusText(status)+": "); ok && status != 0 {
			return errors.New(msg) // the controller's own words: `impair: VM "x" is not up`
		}
		return AccessHint(err)
	}
	if resp.Error != "" {
		return fmt.Errorf("impair %s: the pass that applied it: %s", o.VM, resp.Error)
	}
	if resp.Status != nil {
		for _, a := range resp.Status.Attachments {
			if a.VM == o.VM && (o.Network == "" || a.Network == o.Network) {
				fmt.Fprintf(o.Out, "%s/%d on %s: %s\n", a.VM, a.Index, a.Network, ImpairText(a))
			}
		}
	}
	return nil
}

// ImpairText is what an attachment's link does, for people: "impair
// loss toVM 10%", "no impairment", and who set it when `vmnetctl impair`
// did, with its VM file's.
func ImpairText(a ctlapi.AttachmentStatus) string {
	s := "no impairment"
	if a.Impair.String() != "" {
		s = "impair " + a.Impair.String()
	}
	if a.ImpairSetBy != "" {
		file := "none"
		if a.ImpairFile.String() != "" {
			file = a.ImpairFile.String()
		}
		s += fmt.Sprintf(" (set by %s; the VM file's: %s)", a.ImpairSetBy, file)
	}
	return s
}
