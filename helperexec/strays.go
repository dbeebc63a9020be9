package helperexec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/procid"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// isHelperOf reports whether a command line runs a helper (`vmnetctl
// helper` or vmnet-helper, directly or through sudo) for state dir sd: one
// of its arguments names a file in sd. The command a helper's relay runs to
// relearn a MAC has the helper's arguments, and is not one.
func isHelperOf(sd statedir.Dir, cmdline []string) bool {
	helper := false
	for i, arg := range cmdline {
		if (i == 1 && arg == "helper") || filepath.Base(arg) == "vmnet-helper" {
			helper = true
		}
		if arg == "--"+RelearnFlag {
			return false
		}
	}
	return helper && slices.ContainsFunc(cmdline, sd.Holds)
}

// StrayHelpers are the running helpers of sd that known does not account
// for: helpers started by a controller, or by `vmnetctl run`, that was
// killed before it recorded them. They are found in the process table, not
// in the state files; known is asked only once the table is read, so that
// what it reads of the records is at least as new as the table.
func StrayHelpers(sd statedir.Dir, known func(pid int) bool) []procid.Identity {
	procs, _ := procid.Processes(func(cmdline []string) bool { return isHelperOf(sd, cmdline) })
	return slices.DeleteFunc(procs, func(p procid.Identity) bool { return known(p.PID) })
}

// StraySpares are the spare relays of sd's controllers still running
// (helperproto.IsSpareOf), to be stopped by a controller that starts: a
// spare exits when its controller's socket closes, but not one that is
// stopped, or has not run since.
func StraySpares(sd statedir.Dir) []procid.Identity {
	procs, _ := procid.Processes(func(cmdline []string) bool { return helperproto.IsSpareOf(cmdline, sd.Path) })
	return procs
}

// StopProcesses stops processes in parallel, each SIGTERM and, after
// grace, SIGKILL, and returns once all are gone.
func StopProcesses(procs []procid.Identity, grace time.Duration) {
	var g errgroup.Group
	g.SetLimit(StopWorkers)
	for _, p := range procs {
		g.Go(func() error { p.Kill(grace); return nil })
	}
	g.Wait()
}

// KnownHelperPIDs are the pids of the helpers a fresh controller must not
// take for strays although its runtime.json does not hold them: those every
// `vmnetctl run` of sd recorded, those a live `vmnetctl run` (or any live
// starter) is starting and recorded an intent for (SaveHelperIntent: the
// helper is the process with the intent's command line), and the processes
// that hold a project (Project.Holder).
func KnownHelperPIDs(sd statedir.Dir) map[int]bool {
	pids := map[int]bool{}
	projects, _ := sd.Projects()
	for _, p := range projects {
		if p.Holder != nil && p.Holder.Alive() {
			pids[p.Holder.PID] = true
		}
		if !p.External {
			continue
		}
		recs, _ := sd.RunHelpers(p.Name)
		for _, r := range recs {
			pids[r.Proc.PID] = true
		}
	}
	var argvs []string
	for _, in := range sd.HelperIntents() {
		if in.Starter.PID != os.Getpid() && in.Starter.Alive() {
			argvs = append(argvs, strings.Join(in.Argv, "\x00"))
		}
	}
	if len(argvs) > 0 {
		procs, _ := procid.Processes(func(cmdline []string) bool {
			return slices.Contains(argvs, strings.Join(cmdline, "\x00"))
		})
		for _, p := range procs {
			pids[p.PID] = true
		}
	}
	return pids
}

// StopWorkers is how many helpers stop at once: a stop is mostly waiting
// for the process to exit.
const StopWorkers = 64
