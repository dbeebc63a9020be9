package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/backend"
	"github.com/vmnetctl/vmnetctl/backends"
	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/doctor"
	"github.com/vmnetctl/vmnetctl/helperexec"
	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/launch"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// The use cases: what each command of vmnetctl does, as one call. The
// command line only binds flags and calls one of these.

// Env is where an operation runs and reports.
type Env struct {
	StateDir statedir.Dir
	// Stdout receives progress ("Removing project x."), Stderr warnings.
	Stdout, Stderr io.Writer
	// Executable is vmnetctl, which runs the controller and the helpers
	// (default: this program).
	Executable string
}

func (e Env) executable() (string, error) {
	if e.Executable != "" {
		return e.Executable, nil
	}
	return os.Executable()
}

func (e Env) warn(diags api.Diagnostics) {
	if e.Stderr == nil {
		return
	}
	for _, d := range diags.Warnings().Sorted() {
		fmt.Fprintln(e.Stderr, d)
	}
}

// Input is what a command was given: networks.yaml and VM files, as bytes,
// read once. The bytes validated are the bytes stored.
type Input struct {
	Networks statedir.NetworksSnapshot
	Files    []statedir.ProjectFile
	// VMName is --name, the VM of a lima instance file.
	VMName string
	// Project is -p; empty derives it from the files (statedir.ProjectName).
	Project string
	// NetworksNamed is set when the user named networks.yaml (--networks
	// or $VMNETCTL_NETWORKS); otherwise the networks of record win.
	NetworksNamed bool
}

// useNetworksOfRecord makes an Input whose networks.yaml the user did not
// name use the one the state dir's projects run with: the last one named.
// Without it, an `up` of one project with the defaults would take another
// project's networks (its reservations, its lease times) away.
func (in *Input) useNetworksOfRecord(env Env) error {
	if in.NetworksNamed {
		return nil
	}
	// Whether any project is recorded: their names, not every record
	// decoded (1,000 of them beside a fleet of projects).
	names, err := env.StateDir.ProjectNames()
	if err != nil || len(names) == 0 {
		return err
	}
	snap, err := env.StateDir.Networks()
	if err != nil || snap == nil {
		return err
	}
	if !snap.Same(in.Networks) {
		if env.Stderr != nil {
			fmt.Fprintf(env.Stderr, "using the networks of record (%s, from the last up that named one); name another with --networks\n", snap.Source)
		}
		in.Networks = *snap
	}
	return nil
}

// ReadInput reads networks.yaml (networksPath, else as config.ReadNetworks
// finds it) and the VM files.
func ReadInput(networksPath string, files []string, vmName, project string) (*Input, error) {
	source, data, err := config.ReadNetworks(networksPath)
	if err != nil {
		return nil, err
	}
	var abs string
	if source != config.EmbeddedSource {
		abs, _ = filepath.Abs(source)
	}
	in := &Input{Networks: statedir.NetworksSnapshot{Source: source, Data: data, Abs: abs}, VMName: vmName, Project: project,
		NetworksNamed: networksPath != "" || os.Getenv(config.EnvNetworks) != ""}
	for _, path := range files {
		b, err := config.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading VM file: %w", err)
		}
		abs, _ := filepath.Abs(path)
		in.Files = append(in.Files, statedir.ProjectFile{Path: path, Data: b, Abs: abs})
	}
	return in, nil
}

// loaded is an Input parsed, once per operation: the networks, and the VM
// files as a project (not resolved yet: that happens with every other
// project of the state dir).
type Loaded struct {
	Networks *api.Networks
	Project  spec.ParsedProject
}

// load parses the input, reports its warnings and fails on its errors.
func (in *Input) Load(env Env) (*Loaded, error) {
	if len(in.Files) == 0 {
		return nil, errors.New("no VM file given (-f FILE)")
	}
	nets, diags := api.LoadNetworks(in.Networks.Source, in.Networks.Data)
	p := &statedir.Project{Name: in.Project, Files: in.Files, VMName: in.VMName,
		UID: ownerID("SUDO_UID", os.Getuid()), GID: ownerID("SUDO_GID", os.Getgid())}
	pp, fdiags := spec.ParseProject(p)
	diags = append(diags, fdiags...)
	env.warn(diags)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	if err := env.StateDir.CheckSocketPaths(pp.Files); err != nil {
		return nil, err
	}
	if p.Name == "" {
		p.Name = statedir.ProjectName(pp.Files)
	}
	return &Loaded{Networks: nets, Project: pp}, nil
}

// Doctor checks the host for the networks of in's networks.yaml
// (`vmnetctl doctor`). It changes nothing.
func Doctor(ctx context.Context, env Env, in *Input) (*doctor.Report, error) {
	// The networks up and plan would use: those of record, unless named.
	nets, err := networksOf(env, in)
	if errors.Is(err, fs.ErrPermission) {
		// A user who may not read the state dir still gets the host's
		// checks, for the networks named or found.
		if env.Stderr != nil {
			fmt.Fprintf(env.Stderr, "cannot read the networks of record (%v): checking %s; run with sudo to check them\n", err, in.Networks.Source)
		}
		in.NetworksNamed = true
		nets, err = networksOf(env, in)
	}
	if err != nil {
		return nil, err
	}
	return doctor.Run(ctx, nets.Networks), nil
}

// ownerID is the id of the user behind sudo, else fallback.
func ownerID(env string, fallback int) int {
	if v := helperproto.SudoID(env); v >= 0 {
		return v
	}
	return fallback
}

// DesiredWith is the desired state with l's project added to (or replacing)
// the state dir's projects; it fails with every problem listed.
// keep is the MACs that run (KeptMACs): plan shows what up does; up's own
// checks need none (no MAC derived is refused).
func (l *Loaded) DesiredWith(env Env, existing []*statedir.Project, keep map[string]string) (*spec.Desired, error) {
	var others []*statedir.Project
	for _, q := range existing {
		if q.Name != l.Project.Name {
			others = append(others, q)
		}
	}
	parsed, diags := spec.ParseProjects(others)
	d, rdiags := spec.Resolve(l.Networks, append([]spec.ParsedProject{l.Project}, parsed...), keep)
	diags = append(diags, rdiags...)
	env.warn(rdiags)
	if err := diags.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

// ApplyOptions configure Apply.
type ApplyOptions struct {
	// MetricsAddr is where a controller that Apply starts serves /metrics.
	MetricsAddr string
	// Progress, if set (a terminal), gets a progress line redrawn in
	// place while the controller converges.
	Progress io.Writer
	// Force lets an up change or remove networks other projects use
	// (checkOthersNetworks).
	Force bool
}

// ApplyResult is what Apply did.
type ApplyResult struct {
	Project string
	Status  *ctlapi.Status
	// Error is the controller's last reconcile error, if any.
	Error string
}

// Err says what of the project did not come up: its attachments that do
// not run and the networks they need that are not up, or nil. `up` exits
// non-zero with it, after printing the status.
func (r *ApplyResult) Err() error {
	if r.Status == nil {
		return nil
	}
	var bad []string
	needed := map[string]bool{}
	for _, a := range r.Status.Attachments {
		if a.Project != r.Project {
			continue
		}
		needed[a.Network] = true
		if a.State != ctlapi.StateRunning {
			why := a.State
			if a.Error != "" {
				why += ": " + a.Error
			}
			bad = append(bad, fmt.Sprintf("%s/%d is %s", a.VM, a.Index, why))
		}
	}
	for _, n := range r.Status.Networks {
		if needed[n.Name] && n.State != "up" {
			bad = append(bad, fmt.Sprintf("network %s is %s: %s", n.Name, n.State, n.Error))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("project %s is not all up: %s", r.Project, strings.Join(bad, "; "))
}

// Apply is `vmnetctl up`: it validates the input against every project of
// the state dir, records it as a project, starts the controller if none
// runs, and returns once the controller has converged.
func Apply(ctx context.Context, env Env, in *Input, o ApplyOptions) (*ApplyResult, error) {
	if err := in.useNetworksOfRecord(env); err != nil {
		return nil, err
	}
	l, err := in.Load(env)
	if err != nil {
		return nil, err
	}
	if res, err := applyByController(ctx, env, in, l, o); !errors.Is(err, errNotApplied) {
		return res, err
	}
	resp, err := applyProject(ctx, env, in, l.Networks, l.Project.Project, func(sd statedir.Dir) error {
		// The record of this name alone: every project's is read only
		// if the command checks by itself (20 ms beside 1,000 projects
		// of one VM, a fleet whose every job is a project).
		same, err := sd.Project(l.Project.Name)
		if err != nil {
			return err
		}
		if err := statedir.NameTaken(l.Project.Project, same, in.Project != ""); err != nil {
			return err
		}
		// A controller that runs with this networks.yaml has the other
		// projects parsed: it checks (a fleet's files are not parsed
		// again for one VM).
		changed := networksChanged(env.StateDir, in.Networks)
		d, err := l.CheckedDesired(ctx, env, sd.Projects, !changed)
		if err != nil {
			return err
		}
		if !o.Force && changed {
			if err := checkOthersNetworks(env.StateDir, d, l.Project.Name); err != nil {
				return err
			}
		}
		return spec.CheckForwardPorts(d, l.Project.Name)
	}, o)
	if err != nil {
		return nil, err
	}
	return &ApplyResult{Project: l.Project.Name, Status: resp.Status, Error: resp.Error}, nil
}

// applyByController is Apply in one request when a controller runs with
// the networks.yaml of record (a VM more in a fleet, or one less: what
// changes no network): it checks the project beside the others, records
// it and converges it (PUT /v1/projects/NAME), holding the ops lock as
// Apply does. An error wrapping errNotApplied when it did not take it:
// Apply then does each step itself.
func applyByController(ctx context.Context, env Env, in *Input, l *Loaded, o ApplyOptions) (*ApplyResult, error) {
	sd := env.StateDir
	if !sd.Exists() || networksChanged(sd, in.Networks) {
		return nil, errNotApplied
	}
	if err := doctorPreflight(ctx); err != nil {
		return nil, err
	}
	cl := NewClient(sd)
	if o.Progress != nil {
		defer showProgressWhile(ctx, cl, o.Progress)()
	}
	resp, err := cl.ApplyProject(ctx, &ctlapi.ApplyRequest{Project: *l.Project.Project, Networks: in.Networks, NameGiven: in.Project != ""})
	if err != nil {
		return nil, err
	}
	env.warn(resp.Resolve)
	if err := append(resp.Others, resp.Resolve...).Err(); err != nil {
		return nil, err
	}
	if resp.Refused != "" {
		return nil, errors.New(resp.Refused)
	}
	if !resp.Recorded {
		return nil, errors.New("the controller did not record the project, and said not why")
	}
	return &ApplyResult{Project: l.Project.Name, Status: resp.Status, Error: resp.Error}, nil
}

// checkOthersNetworks refuses an up (without --force) that would change
// or remove, through the networks.yaml it names, networks that other
// projects' VMs use: their VMs would be cut off or restarted by an up
// they did not run. It names each network, what happens to it and whose
// VMs use it.
func checkOthersNetworks(sd statedir.Dir, desired *spec.Desired, project string) error {
	hit := othersNetworks(sd, desired, project)
	if len(hit) == 0 {
		return nil
	}
	return fmt.Errorf("%s; `vmnetctl plan` shows the change, and up --force makes it", strings.Join(hit, "; "))
}

// networksChanged tells whether snap is not the networks.yaml of record:
// only then may an up change networks other projects use (a VM more or
// less changes none), and only then is it worth planning against every
// attachment that runs (runtime.json and the plan grow with the fleet).
func networksChanged(sd statedir.Dir, snap statedir.NetworksSnapshot) bool {
	rec, err := sd.Networks()
	return err != nil || !rec.Same(snap)
}

// othersNetworks says, one sentence each, which networks that other
// projects' VMs use desired would update, replace or delete.
func othersNetworks(sd statedir.Dir, desired *spec.Desired, project string) []string {
	applied, err := spec.AppliedState(sd)
	if err != nil || applied == nil {
		return nil // nothing recorded runs: nothing to change
	}
	users := map[string][]string{} // network → other projects on it
	for _, a := range applied.Attachments {
		if a.Project != project && !slices.Contains(users[a.Network], a.Project) {
			users[a.Network] = append(users[a.Network], a.Project)
		}
	}
	var hit []string
	for _, ch := range spec.ComputePlan(applied, desired).Networks {
		if ch.Action == spec.ActionCreate || len(users[ch.ID]) == 0 {
			continue
		}
		hit = append(hit, fmt.Sprintf("network %s would be %sd (project %s uses it)", ch.ID, ch.Action, strings.Join(users[ch.ID], ", ")))
	}
	return hit
}

// applyProject records project p (and in's networks.yaml) once check
// accepts it beside the state dir's other projects, and has the controller
// converge: the part of Apply and NetworkCreate after their parsing. One
// up, down or run at a time per state dir; a second waits.
func applyProject(ctx context.Context, env Env, in *Input, nets *api.Networks, p *statedir.Project,
	check func(sd statedir.Dir) error, o ApplyOptions) (*ctlapi.ReconcileResponse, error) {
	if err := doctorPreflight(ctx); err != nil {
		return nil, err
	}
	sd := env.StateDir
	lock, err := sd.LockOps()
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	// Check against the other projects before changing anything.
	if err := check(sd); err != nil {
		return nil, err
	}
	if err := sd.SaveProjectAndNetworks(in.Networks, p); err != nil {
		return nil, err
	}
	return converge(ctx, env, o.Progress, p.Name, serveArgsOf(o, nets)...)
}

// serveArgs are the flags of a controller that Apply or NetworkCreate
// starts.
func serveArgsOf(o ApplyOptions, nets *api.Networks) []string {
	args := []string{"--metrics-addr", o.MetricsAddr}
	if o.MetricsAddr == "" {
		args = nil
	}
	if nets.Group != "" {
		// networks.yaml's group (lima's) may use the controller's API:
		// status and args, without root.
		args = append(args, "--group", nets.Group)
	}
	return args
}

// doctorPreflight: what would make every network fail (no root, no TAPs,
// no nft) is one clear error before anything changes, in doctor's words.
func doctorPreflight(ctx context.Context) error { return doctor.Preflight(ctx) }

// converge starts the controller if none runs and asks it to converge,
// drawing its progress on progress if set. The answer's status is
// project's ("" for everything).
func converge(ctx context.Context, env Env, progress io.Writer, project string, serveArgs ...string) (*ctlapi.ReconcileResponse, error) {
	exe, err := env.executable()
	if err != nil {
		return nil, err
	}
	if err := EnsureController(ctx, env.StateDir, exe, serveArgs...); err != nil {
		return nil, err
	}
	cl := NewClient(env.StateDir)
	if progress != nil {
		defer showProgressWhile(ctx, cl, progress)()
	}
	return cl.ReconcileProject(ctx, project)
}

// showProgressWhile draws the controller's progress on w until the
// function it returns is called.
func showProgressWhile(ctx context.Context, cl *Client, w io.Writer) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		showProgress(pctx, cl, w)
	}()
	return func() { cancel(); <-done }
}

// PlanApply is `vmnetctl plan`: what Apply would change, and the warnings
// of backendName (a name from BackendNames) about what it cannot honour.
func PlanApply(env Env, in *Input, backendName string) (*spec.Plan, error) {
	be, err := backends.ByName(backendName)
	if err != nil {
		return nil, err
	}
	if err := in.useNetworksOfRecord(env); err != nil {
		return nil, err
	}
	l, err := in.Load(env)
	if err != nil {
		return nil, err
	}
	existing, err := env.StateDir.Projects()
	if err != nil {
		return nil, err
	}
	// The MACs the controller keeps for what runs (no record: none).
	rs, _, _ := env.StateDir.LoadRuntime()
	desired, err := l.DesiredWith(env, existing, spec.KeptMACs(rs.Helpers))
	if err != nil {
		return nil, err
	}
	current, err := spec.AppliedState(env.StateDir)
	if err != nil {
		return nil, err
	}
	var atts []*api.Attachment
	for _, a := range desired.Attachments {
		atts = append(atts, a.Attachment)
	}
	for _, l := range be.Limits(desired.Networks, atts) {
		kind := "warning:"
		if l.Refused {
			kind = "error: up would fail:"
		}
		fmt.Fprintln(env.Stderr, kind, l.Message)
	}
	for _, h := range othersNetworks(env.StateDir, desired, l.Project.Name) {
		fmt.Fprintln(env.Stderr, "warning: up needs --force:", h)
	}
	plan := spec.ComputePlan(current, desired)
	if snap, err := env.StateDir.Networks(); err == nil && snap != nil && snap.Source != in.Networks.Source {
		if projects, _ := env.StateDir.Projects(); len(projects) > 0 {
			plan.NetworksFile = []string{snap.Source, in.Networks.Source}
		}
	}
	return plan, nil
}

// RemoveOptions say which projects Remove removes: Input's (by its files
// or -p), or all.
type RemoveOptions struct {
	Input *Input
	All   bool
}

// Remove is `vmnetctl down`: it removes projects and lets the controller
// stop their helpers and the networks nothing needs any more. Removing
// what is not there is fine. When no project is left it waits for the
// controller to exit and cleans the state dir.
func Remove(ctx context.Context, env Env, o RemoveOptions) error {
	sd := env.StateDir
	names, err := projectsToRemove(env, o)
	if err != nil {
		return err
	}
	if !sd.Exists() {
		fmt.Fprintln(env.Stdout, "Nothing to do: no state in", sd.Path)
		return nil
	}
	if err := removeByController(ctx, env, names); !errors.Is(err, errNotApplied) {
		return err
	}
	lock, err := sd.LockOps()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	for _, n := range names {
		existed, err := sd.DeleteProject(n)
		if err != nil {
			return err
		}
		if existed {
			fmt.Fprintf(env.Stdout, "Removing project %s.\n", n)
		} else {
			fmt.Fprintf(env.Stdout, "Project %s is not up.\n", n)
		}
	}
	// Whether any is left: their names (the folder read), not every
	// record decoded, which cost a down 20 ms beside 1,000 projects.
	left, err := sd.ProjectNames()
	if err != nil {
		return err
	}
	if len(left) == 0 && !NewClient(sd).Running(ctx) && !sd.ControllerAlive() && !sd.HasRuntime() {
		// No controller (none answers, and none holds its lock: one
		// that is starting does, before it serves) and no record of
		// what runs: a controller killed before its first record may
		// still have made networks and helpers. What carries this state
		// dir's mark goes.
		stopStrays(env)
		if removed, err := backends.Default().Sweep(ctx, nil, backend.NetworkOptions{Owner: sd.Path, LeaseDir: sd.LeasesDir()}); err != nil {
			return err
		} else if len(removed) > 0 {
			fmt.Fprintf(env.Stderr, "removed network(s) %s that no record accounted for\n", strings.Join(removed, ", "))
		}
		fmt.Fprintln(env.Stdout, "Everything is down.")
		return sd.Clean()
	}
	// The answer's status is not printed: that of a project just removed
	// (nothing) costs nothing, where everything's is every VM's.
	removed := ""
	if len(names) > 0 {
		removed = names[0]
	}
	resp, err := converge(ctx, env, nil, removed)
	if errors.Is(err, ErrControllerExited) && len(left) == 0 {
		// It removed what was left and exited: done.
		stopStrays(env)
		fmt.Fprintln(env.Stdout, "Everything is down.")
		return sd.Clean()
	}
	if err != nil {
		return err
	}
	if len(left) > 0 {
		if resp.Error != "" {
			fmt.Fprintln(env.Stderr, "warning:", resp.Error)
		}
		return nil
	}
	// Nothing left: the controller removes everything and exits, or, run
	// as a service (serve without --exit-when-idle), removes everything and stays.
	if err := waitFor(ctx, 30*time.Second, func() bool { return !sd.ControllerAlive() || resp.Stays && !sd.HasRuntime() }); err != nil {
		return fmt.Errorf("the controller did not exit after the last project was removed; see %s", sd.ControllerLog())
	}
	stopStrays(env)
	fmt.Fprintln(env.Stdout, "Everything is down.")
	if sd.ControllerAlive() {
		return nil // a controller that stays keeps its socket and lock
	}
	return sd.Clean()
}

// removeByController is Remove in one request (DELETE
// /v1/projects/NAME) for one project of several recorded (a VM of a
// fleet): the controller removes it under the ops lock and answers once
// its helpers are gone. Otherwise (the last project: the state dir is
// cleaned after; or no controller takes it) an error wrapping
// errNotApplied, and Remove does it itself.
func removeByController(ctx context.Context, env Env, names []string) error {
	if len(names) != 1 {
		return errNotApplied
	}
	left, err := env.StateDir.ProjectNames()
	if err != nil || len(left) < 2 || !slices.Contains(left, names[0]) {
		return errNotApplied
	}
	resp, err := NewClient(env.StateDir).RemoveProject(ctx, names[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "Removing project %s.\n", names[0])
	if resp.Error != "" {
		fmt.Fprintln(env.Stderr, "warning:", resp.Error)
	}
	return nil
}

// stopStrays stops the helpers of the state dir that still run once no
// project is left: ones a killed controller or `vmnetctl run` never
// recorded. The process table says what runs, not the state files.
func stopStrays(env Env) {
	strays := helperexec.StrayHelpers(env.StateDir, func(int) bool { return false })
	if len(strays) == 0 {
		return
	}
	fmt.Fprintf(env.Stderr, "stopping %d helper(s) that no record accounted for\n", len(strays))
	helperexec.StopProcesses(strays, launch.DefaultStopGrace)
}

// projectsToRemove names the projects of o.
func projectsToRemove(env Env, o RemoveOptions) ([]string, error) {
	if o.All {
		// By their files: one that cannot be read goes too.
		return env.StateDir.ProjectNames()
	}
	in := o.Input
	if in == nil || (in.Project == "" && len(in.Files) == 0) {
		names, _ := env.StateDir.ProjectNames()
		if len(names) == 0 {
			return nil, errors.New("name a project with -p NAME or -f FILE, or --all for every project (none is up)")
		}
		return nil, fmt.Errorf("name a project with -p NAME or -f FILE, or --all for every project (up: %s)", strings.Join(names, ", "))
	}
	if in.Project != "" {
		return []string{in.Project}, nil
	}
	p := &statedir.Project{Files: in.Files, VMName: in.VMName}
	pp, diags := spec.ParseProject(p)
	if diags.HasErrors() && len(pp.Files) < len(in.Files) {
		return nil, diags.Err()
	}
	return []string{statedir.ProjectName(pp.Files)}, nil
}

// removeProject removes a project and lets the controller converge.
func removeProject(ctx context.Context, env Env, name string) {
	lock, err := env.StateDir.LockOps()
	if err != nil {
		return
	}
	defer lock.Unlock()
	if existed, _ := env.StateDir.DeleteProject(name); existed {
		converge(ctx, env, nil, "")
	}
}

// waitFor polls cond until it holds, or fails after timeout.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	return poll(ctx, func() (bool, error) {
		if cond() {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("not within %s", timeout)
		}
		return false, nil
	})
}

// poll calls check every 20 ms until it is done or fails, or ctx ends.
func poll(ctx context.Context, check func() (done bool, err error)) error {
	for {
		if done, err := check(); done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CurrentStatus is `vmnetctl status`: the controller's, or read from the
// state dir, the kernel and the process table when none runs.
func CurrentStatus(ctx context.Context, sd statedir.Dir) (*ctlapi.Status, error) {
	if err := checkAPIAccess(sd); err != nil {
		return nil, err
	}
	cl := NewClient(sd)
	if cl.Running(ctx) {
		return cl.Status(ctx)
	}
	return OfflineStatus(ctx, sd)
}

// checkAPIAccess says what to do when the controller's socket exists but
// this user may not use it (a controller run by root).
func checkAPIAccess(sd statedir.Dir) error {
	sock := sd.APISocket()
	if _, err := os.Stat(sock); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("the state dir %s is root's: run with sudo", sd.Path)
		}
		return nil
	}
	if unix.Access(sock, unix.W_OK) != nil {
		return fmt.Errorf("the controller's socket %s is not yours to use: run with sudo, or let a group use it (`group:` in networks.yaml, or `vmnetctl serve --group GROUP`)", sock)
	}
	return nil
}

// AccessHint gives an error of a verb that reads the state dir the next
// step when this user may not read a file it needs (permission denied):
// run with sudo. (The verbs that ask the controller say first how a group
// may use it: checkAPIAccess.) Every verb that reads the state dir returns
// its errors through it.
func AccessHint(err error) error {
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return fmt.Errorf("%w: run with sudo", err)
}

// RunOptions configure RunVM.
type RunOptions struct {
	// VM is the VM of the input to run (default: its only VM with networks).
	VM      string
	Command []string
	Stdin   io.Reader
}

// RunVM is `vmnetctl run`: it records the VM's attachments as a project
// of their own (run-VM unless -p names it), brings their networks up, and
// runs the command with the attachments as inherited sockets (descriptors
// 4, 5, ...), each with a helper on its other end. When the command exits
// the helpers stop and the project goes. It returns the command's status.
func RunVM(ctx context.Context, env Env, in *Input, o RunOptions) (int, error) {
	l, err := in.Load(env)
	if err != nil {
		return 0, err
	}
	vm, err := chooseVM(l.Project, o.VM)
	if err != nil {
		return 0, err
	}
	p := l.Project.Project
	l.Project.KeepOnly([]string{vm})
	p.OnlyVMs, p.External = []string{vm}, true
	if in.Project == "" {
		p.Name = "run-" + vm
	}
	// The project lives for this process: killed, the controller drops it
	// (and stops its helpers, and the networks only it needed).
	self, err := procid.Self()
	if err != nil {
		return 0, err
	}
	p.Holder = &self
	atts, nets, err := l.startRun(ctx, env, in, vm)
	if errors.Is(err, errAlreadyRuns) {
		return 0, err // (the project is the other run's)
	}
	if err != nil {
		removeProject(context.WithoutCancel(ctx), env, p.Name)
		return 0, err
	}
	defer removeProject(context.WithoutCancel(ctx), env, p.Name)
	exe, err := env.executable()
	if err != nil {
		return 0, err
	}
	cl := NewClient(env.StateDir)
	ln := launch.Launcher{StateDir: env.StateDir, Backend: backends.Default(), Executable: exe, VMNetHelperPath: l.Networks.Paths.VMNetHelper,
		StatsInterval: launch.DefaultStatsInterval, StallTimeout: launch.DefaultStallTimeout, StopGrace: launch.DefaultStopGrace}
	return ln.RunCommand(ctx, launch.VMCommand{Project: p, Attachments: atts, Command: o.Command, Stdin: o.Stdin, Stdout: env.Stdout, Stderr: env.Stderr},
		nets, func() { go cl.Reconcile(context.WithoutCancel(ctx)) }) // the controller watches run's helpers
}

// errAlreadyRuns: another `vmnetctl run` holds the project.
var errAlreadyRuns = errors.New("already runs")

// chooseVM is the VM to run: vm if the files define it with networks,
// else the files' only VM with networks.
func chooseVM(pp spec.ParsedProject, vm string) (string, error) {
	var vms []string
	for _, vf := range pp.Files {
		for _, v := range vf.VMs {
			if len(v.Attachments) > 0 && !slices.Contains(vms, v.Name) {
				vms = append(vms, v.Name)
			}
		}
	}
	switch {
	case vm == "" && len(vms) == 1:
		return vms[0], nil
	case vm == "":
		return "", fmt.Errorf("the file has %d VMs with networks (%v); choose one with --vm", len(vms), vms)
	case !slices.Contains(vms, vm):
		return "", fmt.Errorf("VM %q has no network attachments in the file (VMs: %v)", vm, vms)
	}
	return vm, nil
}

// startRun records run's project and brings its networks up, under the
// state dir's ops lock. It returns the VM's attachments.
func (l *Loaded) startRun(ctx context.Context, env Env, in *Input, vm string) ([]*spec.Attachment, launch.NetworkByID, error) {
	sd := env.StateDir
	lock, err := sd.LockOps()
	if err != nil {
		return nil, nil, err
	}
	defer lock.Unlock()
	existing, err := sd.Projects()
	if err != nil {
		return nil, nil, err
	}
	// run starts the helpers itself: with the MACs the controller keeps.
	rs, _, _ := sd.LoadRuntime()
	d, err := l.DesiredWith(env, existing, spec.KeptMACs(rs.Helpers))
	if err != nil {
		return nil, nil, err
	}
	var atts []*spec.Attachment
	for _, a := range d.Attachments {
		if a.VM == vm && a.Project == l.Project.Name {
			atts = append(atts, a)
		}
	}
	if len(atts) == 0 {
		return nil, nil, fmt.Errorf("VM %q has no network attachments that vmnetctl manages", vm)
	}
	// A second run of the same project would take over the first's
	// attachments (and remove its TAPs) while the first runs.
	for _, p := range existing {
		if p.Name == l.Project.Name && p.Holder != nil && p.Holder.Alive() && p.Holder.PID != os.Getpid() {
			return nil, nil, fmt.Errorf("VM %q %w: `vmnetctl run` (pid %d) holds project %q; stop it first", vm, errAlreadyRuns, p.Holder.PID, p.Name)
		}
	}
	if err := sd.SaveProjectAndNetworks(in.Networks, l.Project.Project); err != nil {
		return nil, nil, err
	}
	resp, err := converge(ctx, env, nil, l.Project.Name)
	if err != nil {
		return nil, nil, err
	}
	for _, n := range resp.Status.Networks {
		for _, a := range atts {
			if a.Network == n.Name && n.State != "up" {
				return nil, nil, fmt.Errorf("network %s is not up: %s", n.Name, n.Error)
			}
		}
	}
	nets := launch.NetworkByID{}
	for _, n := range l.Networks.Networks {
		nets[n.ID] = n
	}
	return atts, nets, nil
}
