package helperproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// A spare relay is vmnetctl-relay started by the controller before a VM
// needs it, as a helper would be (the same program, credentials and
// environment), to wait on its end of a socket pair: a VM's attach then
// hands it the helper's command line, spec and descriptors in one
// message (HandOver) instead of starting a process, whose start (exec,
// the Go runtime's start, page faults) was most of an attach's pass. The
// spare takes the descriptors where an exec would have put them, writes
// the helper's command line over its own (SpareArgs left room for it),
// and is then that helper. A spare whose socket closes before a hand-over
// (the controller exited, or dropped it) exits.

// EnvSpare, in a spare's environment, is the descriptor of its end of
// the controller's socket.
const EnvSpare = "VMNETCTL_RELAY_SPARE"

// EnvRelaySpec is the variable that hands vmnetctl-relay its spec (JSON,
// relay.Spec): in its environment when it is started as a helper, in the
// HandOver when a spare becomes one.
const EnvRelaySpec = "VMNETCTL_RELAY_SPEC"

// SpareArg is a spare's first argument.
const SpareArg = "spare"

// SpareRoom is how many bytes of its command line a spare keeps for the
// command line of the helper it becomes: spaces, which a hand-over writes
// over.
const SpareRoom = 8192

// SpareArgs is the command line of a spare of program prog, started by
// the controller of state dir stateDir (its mark: a controller that
// starts finds a dead one's spares by it).
func SpareArgs(prog, stateDir string) []string {
	return []string{prog, SpareArg, stateDir, strings.Repeat(" ", SpareRoom)}
}

// IsSpareOf reports whether a process's command line is a spare's that
// the controller of stateDir started, and still waits.
func IsSpareOf(cmdline []string, stateDir string) bool {
	return len(cmdline) == 4 && cmdline[1] == SpareArg && cmdline[2] == stateDir
}

// SpareCtlFD is the descriptor a spare starts with its end of the
// controller's socket on; 3 up to it are /dev/null, held for the
// descriptors a hand-over brings (MaxHandOverFiles of them from 1 on),
// so that what the spare's Go runtime opens as it starts (since Go
// 1.25, the cgroup's CPU limit files, kept open) lands above them, where
// no hand-over's descriptor is put.
const SpareCtlFD = MaxHandOverFiles + 3

// CmdlineLen is how many bytes argv takes of a process's command line:
// each argument and its terminating NUL.
func CmdlineLen(argv []string) int {
	n := 0
	for _, a := range argv {
		n += len(a) + 1
	}
	return n
}

// FitsSpare reports whether a spare of program prog and state dir
// stateDir can take command line argv: it fits where SpareArgs was, and
// does not end with an empty argument (the NULs a shorter command line
// leaves after it read as the end of the last one: procid.Read).
func FitsSpare(prog, stateDir string, argv []string) bool {
	return len(argv) > 0 && argv[len(argv)-1] != "" && CmdlineLen(argv) <= CmdlineLen(SpareArgs(prog, stateDir))
}

// MaxHandOver bounds a HandOver's encoding.
const MaxHandOver = 64 << 10

// MaxHandOverFiles bounds the descriptors that come with a HandOver.
const MaxHandOverFiles = 16

// HandOver is what the controller sends a spare, with its descriptors
// (SCM_RIGHTS): the helper's stdout, its stderr, then those it has from
// descriptor 3 on, in that order.
type HandOver struct {
	// Argv is the helper's command line.
	Argv []string `json:"argv"`
	// Spec is what EnvRelaySpec would have said.
	Spec string `json:"spec"`
	// Files is how many descriptors come with it.
	Files int `json:"files"`
}

// Encode is h as it is sent.
func (h HandOver) Encode() ([]byte, error) {
	b, err := json.Marshal(h)
	if err == nil && len(b) > MaxHandOver {
		err = fmt.Errorf("a hand-over of %d bytes, past %d", len(b), MaxHandOver)
	}
	return b, err
}

// DecodeHandOver reads what Encode wrote.
func DecodeHandOver(b []byte) (HandOver, error) {
	var h HandOver
	if err := json.Unmarshal(b, &h); err != nil {
		return HandOver{}, fmt.Errorf("a spare's hand-over: %w", err)
	}
	if len(h.Argv) == 0 || h.Files < 2 || h.Files > MaxHandOverFiles {
		return HandOver{}, errors.New("a spare's hand-over without a command line, stdout and stderr")
	}
	return h, nil
}
