package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// lastEvent returns the last event of the state dir's events log that
// match accepts, or nil.
func lastEvent(sd statedir.Dir, match func(ctlapi.Event) bool) *ctlapi.Event {
	b, err := os.ReadFile(sd.EventsLog())
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var ev ctlapi.Event
		if json.Unmarshal([]byte(lines[i]), &ev) == nil && match(ev) {
			return &ev
		}
	}
	return nil
}

// Events writes the state dir's events to w, as lines for people or (with
// asJSON) one JSON object per line; with follow it then writes new ones as
// they come until ctx ends.
func Events(ctx context.Context, sd statedir.Dir, asJSON, follow bool, w io.Writer) error {
	return EventsTail(ctx, sd, TailOptions{JSON: asJSON, Follow: follow}, EventFilter{}, w)
}

// ParseSince is `--since`: "" for none, a duration before now (10m), or a
// time (RFC 3339).
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q is neither a duration (10m, 2h) nor a time (2026-12-05T08:00:00Z)", s)
}

// EventFilter is `events`' choice of events: of these kinds (any if
// none), of this VM's attachments, on this network ("" for any).
type EventFilter struct {
	Kinds       []string
	VM, Network string
}

// ParseKinds is `--kind`: kinds separated by commas, each one of
// ctlapi.EventKinds.
func ParseKinds(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var kinds []string
	for k := range strings.SplitSeq(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(ctlapi.EventKinds, k) {
			return nil, fmt.Errorf("--kind %q is no kind of event; the kinds: %s", k, strings.Join(ctlapi.EventKinds, ", "))
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// match reports whether ev is one f chooses.
func (f EventFilter) match(ev ctlapi.Event) bool {
	vm, _, _ := strings.Cut(ev.Attachment, "/")
	return (len(f.Kinds) == 0 || slices.Contains(f.Kinds, ev.Kind)) &&
		(f.VM == "" || vm == f.VM) && (f.Network == "" || ev.Network == f.Network)
}

// EventsTail is Events with TailOptions and a filter: the last o.Tail
// events that f chooses, those since o.Since.
func EventsTail(ctx context.Context, sd statedir.Dir, o TailOptions, f EventFilter, w io.Writer) error {
	src := &logSource{path: sd.EventsLog()}
	out := w
	if !o.JSON {
		out = &eventPrinter{w: w}
	}
	var keep func([]byte) bool
	// named: whether any event names f's VM and network, whatever its
	// kind and time (for the error below).
	named := false
	if !o.Since.IsZero() || len(f.Kinds) > 0 || f.VM != "" || f.Network != "" {
		names := EventFilter{VM: f.VM, Network: f.Network}
		keep = func(line []byte) bool {
			var ev ctlapi.Event
			if json.Unmarshal(line, &ev) != nil {
				return false
			}
			named = named || names.match(ev)
			return !ev.Time.Before(o.Since) && f.match(ev)
		}
	}
	if err := tailWith(ctx, []*logSource{src}, out, o, keep); err != nil {
		return err
	}
	if !o.Follow && !named && (f.VM != "" || f.Network != "") {
		// A name mistyped would print nothing, as a quiet VM does: say
		// which it is. (Following, the VM may come.)
		var what []string
		if f.VM != "" {
			what = append(what, fmt.Sprintf("VM %q", f.VM))
		}
		if f.Network != "" {
			what = append(what, fmt.Sprintf("network %q", f.Network))
		}
		return fmt.Errorf("no event names %s, of any kind, in %s (names are case-sensitive; `vmnetctl status` lists the VMs)", strings.Join(what, " on "), sd.EventsLog())
	}
	return nil
}

// eventPrinter turns JSON event lines into lines for people.
type eventPrinter struct{ w io.Writer }

func (p *eventPrinter) Write(b []byte) (int, error) {
	var ev ctlapi.Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return len(b), nil // not an event: skipped
	}
	subject := ev.Attachment
	if subject == "" {
		subject = ev.Network
	} else if ev.Network != "" {
		subject += " on " + ev.Network
	}
	var extra []string
	for _, kv := range [][2]string{{"mac", ev.MAC}, {"ip", ev.IP}, {"pid", pidString(ev.PID)}} {
		if kv[1] != "" {
			extra = append(extra, kv[0]+"="+kv[1])
		}
	}
	if ev.Detail != "" {
		extra = append(extra, ev.Detail)
	}
	line := strings.Join(append([]string{ev.Time.Local().Format("2006-01-02 15:04:05.000"), fmt.Sprintf("%-16s", ev.Kind), subject}, extra...), " ")
	_, err := fmt.Fprintln(p.w, strings.TrimRight(line, " "))
	return len(b), err
}

func pidString(pid int) string {
	if pid == 0 {
		return ""
	}
	return fmt.Sprint(pid)
}
