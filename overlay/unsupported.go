//go:build !linux

package overlay

import (
	"context"
	"errors"

	"github.com/vmnetctl/vmnetctl/api"
)

// EnsureFRR is Linux's: the overlay runs in vmnetctl's own data plane.
func EnsureFRR(context.Context, *api.Network) error { return errors.ErrUnsupported }
