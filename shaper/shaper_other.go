//go:build !linux

package shaper

import (
	"errors"

	"github.com/vmnetctl/vmnetctl/api"
)

// Set limits a port's bandwidth: Linux only.
func Set(string, *api.Bandwidth) error { return errors.ErrUnsupported }

// Get reads a port's limits: Linux only.
func Get(string) (*api.Bandwidth, error) { return nil, errors.ErrUnsupported }

// Remove deletes a port's IFB device: Linux only.
func Remove(string) error { return nil }

// SweepStrays deletes the IFB devices of ports gone: Linux only.
func SweepStrays() error { return nil }
