//go:build !linux

package helper

import (
	"context"
	"errors"
	"io"
)

// errNotLinux: elsewhere vmnetctl runs vmnet-helper itself.
var errNotLinux = errors.New("`vmnetctl helper` runs on Linux only; on macOS vmnetctl uses vmnet-helper")

// Run is Linux only.
func Run(context.Context, Options) error { return errNotLinux }

// ListSharedInterfaces is Linux only.
func ListSharedInterfaces() ([]string, error) { return nil, errNotLinux }

// DeleteLinkFlag is the hidden flag of the child that deletes a macvtap.
const DeleteLinkFlag = "delete-link-on-eof"

// DeleteLinkOnEOF is Linux only.
func DeleteLinkOnEOF(string, io.Reader) error { return errNotLinux }
