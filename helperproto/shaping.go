package helperproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Shaping is what a helper does on purpose to the frames of one
// direction of its link, in its own memory, to test how a guest copes
// (a VM file's `impair`: delay, jitter, duplicate, reorder): each frame
// is held Delay, give or take up to Jitter (drawn evenly), so that
// jittered frames may pass each other; Duplicate of them (in hundredths
// of a percent) are sent twice; Reorder of them are sent at once, past
// the held ones (netem's `reorder`). The zero Shaping does nothing.
type Shaping struct {
	Delay     time.Duration `json:"delay,omitempty"`
	Jitter    time.Duration `json:"jitter,omitempty"`
	Duplicate uint32        `json:"duplicate,omitempty"`
	Reorder   uint32        `json:"reorder,omitempty"`
}

// ShapingScale is what Duplicate and Reorder are counted out of: 10000,
// 100%.
const ShapingScale = 10000

// MaxShapingDelay bounds Delay and Jitter.
const MaxShapingDelay = time.Minute

// String is s as the helper logs it: "delay 50ms ±5ms, duplicate 1%,
// reorder 25%"; "nothing" for the zero Shaping.
func (s Shaping) String() string {
	var parts []string
	if s.Delay > 0 {
		d := "delay " + s.Delay.String()
		if s.Jitter > 0 {
			d += " ±" + s.Jitter.String()
		}
		parts = append(parts, d)
	}
	if s.Duplicate > 0 {
		parts = append(parts, "duplicate "+share(s.Duplicate))
	}
	if s.Reorder > 0 {
		parts = append(parts, "reorder "+share(s.Reorder))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// share is a share in hundredths of a percent as a percentage: "1%",
// "0.25%".
func share(v uint32) string { return strconv.FormatFloat(float64(v)/100, 'f', -1, 64) + "%" }

// Zero says that s does nothing.
func (s Shaping) Zero() bool { return s == Shaping{} }

// Check says what is wrong with s, if anything.
func (s Shaping) Check() error {
	switch {
	case s.Delay < 0 || s.Delay > MaxShapingDelay:
		return fmt.Errorf("a delay of %v: from 0 to %v", s.Delay, MaxShapingDelay)
	case s.Jitter < 0 || s.Jitter > s.Delay:
		return fmt.Errorf("a jitter of %v: from 0 to the delay (%v)", s.Jitter, s.Delay)
	case s.Duplicate > ShapingScale || s.Reorder > ShapingScale:
		return errors.New("a share over 100%")
	case s.Reorder > 0 && s.Delay == 0:
		return errors.New("reordering needs a delay to pass")
	}
	return nil
}

// Shapings are a helper's, both ways: to the VM (what the host's end of
// the link sends it) and from it. The controller keeps them in a file
// (`vmnetctl helper --shaping-file`), written in place, and sends
// ShapingSignal once it changed; the helper opens it as root when it
// starts, keeps it open (the controller's state dir is not the VM
// owner's), and reads it when it starts serving and at each signal.
type Shapings struct {
	ToVM   Shaping `json:"toVM"`
	FromVM Shaping `json:"fromVM"`
}

// ShapingSignal tells a helper to read its shaping file again. The
// helpers start with it ignored (helperexec), and a Go program catches
// and ignores it by default, so that one sent before the helper listens
// for it is lost, not fatal: the helper reads the file once it listens.
const ShapingSignal = syscall.SIGUSR1

// ReadShapings reads an open shaping file from its start: an empty one
// is no shaping; one larger than 4 KiB, or that does not check (one read
// while the controller writes it, too), is an error.
func ReadShapings(f *os.File) (Shapings, error) {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 4<<10+1))
	if err != nil || len(b) == 0 {
		return Shapings{}, err
	}
	if len(b) > 4<<10 {
		return Shapings{}, fmt.Errorf("%s: over 4 KiB", f.Name())
	}
	var s Shapings
	if err := json.Unmarshal(b, &s); err != nil {
		return Shapings{}, fmt.Errorf("%s: %w", f.Name(), err)
	}
	for _, d := range []struct {
		s    Shaping
		name string
	}{{s.ToVM, "toVM"}, {s.FromVM, "fromVM"}} {
		if err := d.s.Check(); err != nil {
			return Shapings{}, fmt.Errorf("%s: %s: %w", f.Name(), d.name, err)
		}
	}
	return s, nil
}

// WriteShapings writes s into the shaping file at path, in place (the
// helpers hold it open), with mode 0640; it writes nothing, and says so,
// when the file holds s already (no file, or an empty one, holds none).
// The controller is its one writer: what the read-only look found is
// what the write replaces.
func WriteShapings(path string, s Shapings) (changed bool, err error) {
	b, err := json.Marshal(s)
	if err != nil {
		return false, err
	}
	// Read first, opened for reading only: closing a file opened for
	// writing tells a watch of its directory it was written
	// (IN_CLOSE_WRITE), and the controller's full pass, which reads only
	// the files its watch saw written, would read this one every time.
	if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0); err == nil {
		old, err := ReadShapings(f)
		f.Close()
		if err == nil && old == s {
			return false, nil
		}
	} else if errors.Is(err, os.ErrNotExist) && s == (Shapings{}) {
		return false, nil // (none asked, none there)
	}
	flags := os.O_RDWR | syscall.O_NOFOLLOW | syscall.O_CLOEXEC
	if s != (Shapings{}) {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o640)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // (none asked, none there)
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return false, err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return false, err
	}
	return true, f.Close()
}
