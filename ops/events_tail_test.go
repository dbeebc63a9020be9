package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
	"github.com/vmnetctl/vmnetctl/statedir"
)

// TestEventsTail: `events --tail N` prints the last N events, `--since`
// those from then on, and both together the last N of those; --vm,
// --network and --kind choose among them; --since takes a duration or a
// time, and --kind known kinds, and each says what it wants otherwise.
func TestEventsTail(t *testing.T) {
	sd := statedir.Dir{Path: t.TempDir()}
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	var log bytes.Buffer
	for i := range 5 {
		b, _ := json.Marshal(ctlapi.Event{Time: t0.Add(time.Duration(i) * time.Minute), Kind: "k" + string(rune('0'+i)),
			Attachment: []string{"web/0", "web/1", "db/0", "web2/0", ""}[i], Network: []string{"a", "b", "a", "a", "a"}[i]})
		log.Write(append(b, '\n'))
	}
	if err := os.WriteFile(sd.EventsLog(), log.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	kinds := func(o TailOptions, f EventFilter) string {
		t.Helper()
		o.JSON = true
		var out bytes.Buffer
		if err := EventsTail(context.Background(), sd, o, f, &out); err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var ev ctlapi.Event
			if json.Unmarshal([]byte(l), &ev) == nil {
				ks = append(ks, ev.Kind)
			}
		}
		return strings.Join(ks, " ")
	}
	for _, c := range []struct {
		o    TailOptions
		f    EventFilter
		want string
	}{
		{TailOptions{}, EventFilter{}, "k0 k1 k2 k3 k4"},
		{TailOptions{Tail: 2}, EventFilter{}, "k3 k4"},
		{TailOptions{Since: t0.Add(2 * time.Minute)}, EventFilter{}, "k2 k3 k4"},
		{TailOptions{Since: t0.Add(2 * time.Minute), Tail: 1}, EventFilter{}, "k4"},
		// Filters: a VM's attachments (not web2's), a network, kinds, and
		// --tail counts what they choose.
		{TailOptions{}, EventFilter{VM: "web"}, "k0 k1"},
		{TailOptions{}, EventFilter{Network: "a"}, "k0 k2 k3 k4"},
		{TailOptions{}, EventFilter{Kinds: []string{"k1", "k3"}}, "k1 k3"},
		{TailOptions{Tail: 1}, EventFilter{VM: "web", Network: "a"}, "k0"},
		{TailOptions{Since: t0.Add(time.Minute)}, EventFilter{Network: "a"}, "k2 k3 k4"},
	} {
		if got := kinds(c.o, c.f); got != c.want {
			t.Errorf("%+v %+v: %q, want %q", c.o, c.f, got, c.want)
		}
	}
	// A VM or network no event names is an error (a name mistyped would
	// print nothing); one that has no event of the kinds asked is not.
	for _, c := range []struct {
		f    EventFilter
		want string
	}{
		{EventFilter{VM: "wbe"}, `no event names VM "wbe"`},
		{EventFilter{Network: "A"}, `no event names network "A"`},
		{EventFilter{VM: "db", Network: "b"}, `no event names VM "db" on network "b"`},
		{EventFilter{VM: "web", Kinds: []string{"k4"}}, ""},
	} {
		var out bytes.Buffer
		err := EventsTail(context.Background(), sd, TailOptions{}, c.f, &out)
		if c.want == "" && (err != nil || out.Len() > 0) || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, printed %q; want %q", c.f, err, out.String(), c.want)
		}
	}
	if ks, err := ParseKinds("egress-denied, helper-failed"); err != nil || strings.Join(ks, " ") != "egress-denied helper-failed" {
		t.Errorf("ParseKinds: %q, %v", ks, err)
	}
	if _, err := ParseKinds("egress-deny"); err == nil || !strings.Contains(err.Error(), `--kind "egress-deny" is no kind of event; the kinds: network-up,`) {
		t.Errorf("ParseKinds(egress-deny): %v", err)
	}
	now := t0.Add(time.Hour)
	if got, err := ParseSince("10m", now); err != nil || !got.Equal(now.Add(-10*time.Minute)) {
		t.Errorf("ParseSince(10m) = %v, %v", got, err)
	}
	if got, err := ParseSince("2026-12-05T08:03:00Z", now); err != nil || !got.Equal(t0.Add(3*time.Minute)) {
		t.Errorf("ParseSince(a time) = %v, %v", got, err)
	}
	if _, err := ParseSince("yesterday", now); err == nil || !strings.Contains(err.Error(), "neither a duration") {
		t.Errorf("ParseSince(yesterday): %v", err)
	}
}
