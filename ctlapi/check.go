package ctlapi

import (
	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// CheckRequest is a project that `up` would record.
type CheckRequest struct {
	Project statedir.Project `json:"project"`
}

// CheckResponse is what the controller found.
type CheckResponse struct {
	// Resolve is the diagnostics of resolving the project with the
	// others, warnings included.
	Resolve api.Diagnostics `json:"resolve,omitempty"`
	// Others is the diagnostics of parsing the other projects' files.
	Others api.Diagnostics `json:"others,omitempty"`
}
