// Package controller reconciles the desired state (networks and VM
// attachments from the user's files) against what runs, and keeps them equal.
package controller

import (
	"os"
	"path/filepath"
)

// DefaultStateDir is where vmnetctl keeps its state: /run/vmnetctl for root,
// else $XDG_RUNTIME_DIR/vmnetctl, else ~/.local/state/vmnetctl.
func DefaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/run/vmnetctl"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "vmnetctl")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "vmnetctl")
	}
	return filepath.Join(os.TempDir(), "vmnetctl")
}
