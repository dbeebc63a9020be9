//go:build !linux

package capture

import (
	"context"
	"errors"
	"io"

	"github.com/vmnetctl/vmnetctl/nettypes"
)

// Port captures a port's frames: Linux only (vmnet has no packet socket
// on a VM's interface for vmnetctl).
func Port(context.Context, string, nettypes.CaptureOptions, io.Writer) (nettypes.CaptureStats, error) {
	return nettypes.CaptureStats{}, errors.ErrUnsupported
}
