// Package config finds and reads networks.yaml, falling back to the default
// networks embedded in the binary.
package config

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/vmnetctl/vmnetctl/api"
)

// DefaultNetworks is config/networks.yaml, built into the binary.
//
//go:embed networks.yaml
var DefaultNetworks []byte

// EmbeddedSource is how diagnostics and `networks` name the embedded file.
const EmbeddedSource = "(embedded)/networks.yaml"

// SystemNetworksPath is read when no file is named and it exists.
const SystemNetworksPath = "/etc/vmnetctl/networks.yaml"

// EnvNetworks names a networks.yaml when --networks is not given.
const EnvNetworks = "VMNETCTL_NETWORKS"

// ReadNetworks returns the bytes of networks.yaml and the name to report them
// under: path if set, else $VMNETCTL_NETWORKS, else /etc/vmnetctl/networks.yaml
// if it exists, else the embedded defaults.
func ReadNetworks(path string) (source string, data []byte, err error) {
	if path == "" {
		path = os.Getenv(EnvNetworks)
	}
	if path != "" {
		data, err := ReadFile(path)
		if err != nil {
			return path, nil, fmt.Errorf("reading networks file: %w", err)
		}
		return path, data, nil
	}
	data, err = ReadFile(SystemNetworksPath)
	switch {
	case err == nil:
		return SystemNetworksPath, data, nil
	case errors.Is(err, fs.ErrNotExist):
		return EmbeddedSource, DefaultNetworks, nil
	default:
		return SystemNetworksPath, nil, fmt.Errorf("reading networks file: %w", err)
	}
}

// ReadFile reads an input file (networks.yaml, a VM file) of at most
// api.MaxFileSize bytes, reading no more than one byte past that: a larger
// file is an error without being read whole. Only regular files are read:
// a device (/dev/zero), a FIFO or a socket is refused before any read, so
// nothing blocks or streams without end. Errors name the file.
func ReadFile(path string) ([]byte, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, api.MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > api.MaxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes; vmnetctl reads files of at most %d bytes", path, api.MaxFileSize, api.MaxFileSize)
	}
	return data, nil
}

// fileType names the type of a file that is not regular.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.String()
}

// LoadNetworks reads and parses networks.yaml as ReadNetworks finds it.
// Warnings are returned even when err is nil.
func LoadNetworks(path string) (*api.Networks, api.Diagnostics, error) {
	source, data, err := ReadNetworks(path)
	if err != nil {
		return nil, nil, err
	}
	nets, diags := api.LoadNetworks(source, data)
	return nets, diags, diags.Err()
}
