// Package config finds and reads networks.yaml, falling back to the default
// networks embedded in the binary.
package config

import (
	_ "embed"
	"errors"
	"fmt"
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
		data, err := os.ReadFile(path)
		if err != nil {
			return path, nil, fmt.Errorf("reading networks file: %w", err)
		}
		return path, data, nil
	}
	data, err = os.ReadFile(SystemNetworksPath)
	switch {
	case err == nil:
		return SystemNetworksPath, data, nil
	case errors.Is(err, fs.ErrNotExist):
		return EmbeddedSource, DefaultNetworks, nil
	default:
		return SystemNetworksPath, nil, fmt.Errorf("reading networks file: %w", err)
	}
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
