package controller

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/config"
	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/spec"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Reload is `systemctl reload vmnetctl` (SIGHUP to `vmnetctl serve`): the
// networks.yaml and the projects' VM files are read again from where `up`
// read them (the networks.yaml's path, each file's absolute path), checked
// together as `up` checks them, and recorded; the pass that follows
// applies them. A file that no longer reads or validates changes nothing:
// the error names it, in the log and as a `reload-failed` event. A project
// whose files are gone keeps its record (`down -p` removes it), and so do
// `vmnetctl run`'s, a held network's and `network create`'s, which have no
// files of their own to read.

// hangups is the channel SIGHUP arrives on, once Run asked for it.
func hangups() (<-chan os.Signal, func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c, func() { signal.Stop(c) }
}

// errOpsBusy: an up, down or run holds the state dir's ops lock; the
// reload waits for it (the up waits on this controller's pass: the
// reload cannot take the lock in the pass's place).
var errOpsBusy = errors.New("an up, down or run is under way")

// reloadRetry is how soon a reload that found the ops lock held tries
// again.
const reloadRetry = time.Second

// reload reads the recorded networks.yaml and projects again from their
// files and records them if they changed and validate; it reports whether
// anything changed.
func (c *Controller) reload() (changed bool, err error) {
	lock, err := c.sd.TryLockOps()
	if errors.Is(err, statedir.ErrLocked) {
		return false, errOpsBusy
	}
	if err != nil {
		return false, err
	}
	defer lock.Unlock()
	snap, err := c.sd.Networks()
	if err != nil || snap == nil {
		return false, err // nothing recorded: nothing to read again
	}
	newSnap, err := rereadNetworks(snap)
	if err != nil {
		return false, err
	}
	projects, err := c.projects.Projects(c.sd)
	if err != nil {
		return false, err
	}
	var changedProjects []*statedir.Project
	for i, p := range projects {
		q, err := rereadProject(p)
		if err != nil {
			return false, err
		}
		if q != p {
			projects[i] = q
			changedProjects = append(changedProjects, q)
		}
	}
	netsChanged := !bytes.Equal(newSnap.Data, snap.Data) || newSnap.Source != snap.Source
	if !netsChanged && len(changedProjects) == 0 {
		return false, nil
	}
	nets, err := newSnap.Load()
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	kept := c.keptMACsLocked()
	c.mu.Unlock()
	d, err := spec.ComputeDesired(nets, projects, kept)
	if err != nil {
		return false, err
	}
	// The checks `up` makes of a project beyond its files (a forward of a
	// port the host uses).
	for _, p := range changedProjects {
		if err := spec.CheckForwardPorts(d, p.Name); err != nil {
			return false, err
		}
	}
	if netsChanged {
		if err := c.sd.SaveNetworks(*newSnap); err != nil {
			return false, err
		}
	}
	for _, p := range changedProjects {
		if err := c.sd.SaveProject(p); err != nil {
			return false, err
		}
	}
	return true, nil
}

// rereadNetworks is snap with its file's content now: the file it was
// read from, or for the embedded defaults the file `up` would read now
// (config.ReadNetworks: /etc/vmnetctl/networks.yaml once it exists).
func rereadNetworks(snap *statedir.NetworksSnapshot) (*statedir.NetworksSnapshot, error) {
	var source, abs string
	var data []byte
	var err error
	switch {
	case snap.Abs != "":
		source, abs = snap.Source, snap.Abs
		data, err = config.ReadFile(abs)
	case snap.Source == config.EmbeddedSource:
		source, data, err = config.ReadNetworks("")
		if source != config.EmbeddedSource {
			abs = source
		}
	default:
		return snap, nil // an older record: where it came from is not known
	}
	if err != nil {
		return nil, fmt.Errorf("reading networks.yaml again: %w", err)
	}
	return &statedir.NetworksSnapshot{Source: source, Data: data, Abs: abs}, nil
}

// rereadProject is p with its files' contents now, or p itself when
// nothing changed or it has no files to read (an older record, without
// their absolute paths, too). A project one of whose files is gone keeps
// its record (`down -p` removes it); a file that is there but cannot be
// read (config.ReadFile: regular files only) is an error.
func rereadProject(p *statedir.Project) (*statedir.Project, error) {
	if p.External || p.Holder != nil {
		return p, nil
	}
	var q *statedir.Project
	for i, f := range p.Files {
		if f.Abs == "" {
			continue
		}
		data, err := config.ReadFile(f.Abs)
		if errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
		if err != nil {
			return nil, fmt.Errorf("project %s: reading %s again: %w", p.Name, f.Abs, err)
		}
		if bytes.Equal(data, f.Data) {
			continue
		}
		if q == nil {
			c := *p
			c.Files = append([]statedir.ProjectFile(nil), p.Files...)
			q = &c
		}
		q.Files[i].Data = data
	}
	if q == nil {
		return p, nil
	}
	return q, nil
}

// reloadNow runs a reload asked for (wanted), and tells whether to ask
// again later (the ops lock was held). It logs and records what happened.
func (c *Controller) reloadNow() (retry bool) {
	changed, err := c.reload()
	switch {
	case errors.Is(err, errOpsBusy):
		return true
	case err != nil:
		c.log.Error("reload: nothing changed", "err", err)
		c.emit(ctlapi.Event{Kind: "reload-failed", Detail: err.Error()})
	case changed:
		c.log.Info("reload: networks.yaml and the projects' files read again")
		c.emit(ctlapi.Event{Kind: "reloaded"})
	default:
		c.log.Info("reload: nothing changed")
	}
	return false
}
