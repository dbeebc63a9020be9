package ctlapi

import (
	"github.com/vmnetctl/vmnetctl/statedir"
)

// ProjectsPath is where the API takes projects: PUT ProjectsPath+NAME
// (an ApplyRequest) checks, records and converges project NAME and
// answers once its attachments run (an ApplyResponse); DELETE
// ProjectsPath+NAME removes it and answers once its helpers are gone (a
// ReconcileResponse). Each is what `up` and `down` do for one project,
// in one round trip: the way for a program that runs a fleet (CI
// runners, sandboxes) to attach and detach a VM without a command a VM.
const ProjectsPath = "/v1/projects/"

// ApplyRequest is a project for the controller to check against the
// others, record and converge.
type ApplyRequest struct {
	// Project is the project as `up` would record it; its name is the
	// path's.
	Project statedir.Project `json:"project"`
	// Networks is the networks.yaml the client read. The controller
	// applies the project only if it is the one of record: a request
	// that would change networks is refused with 409 Conflict, and
	// `vmnetctl up` (which plans such a change against every project)
	// makes it.
	Networks statedir.NetworksSnapshot `json:"networks"`
	// NameGiven says the client named the project (-p). Without it the
	// name came from the first file's, and a project of that name that
	// holds another file of the same name (elsewhere) is not replaced:
	// statedir.NameTaken.
	NameGiven bool `json:"nameGiven,omitempty"`
}

// ApplyResponse is the controller's answer to an ApplyRequest (200 OK).
// When the project was refused, Recorded is false, nothing changed, and
// Refused or the errors among the diagnostics say why; otherwise it is
// recorded, and the ReconcileResponse says how its attachments came up.
type ApplyResponse struct {
	CheckResponse
	ReconcileResponse
	Recorded bool   `json:"recorded"`
	Refused  string `json:"refused,omitempty"`
}
