package overlay

import "path/filepath"

// FRRConfigFile is where stateDir keeps the FRR configuration vmnetctl
// wrote for network id's EVPN segment (evpn_linux.go).
func FRRConfigFile(stateDir, id string) string {
	return filepath.Join(stateDir, "frr", id+".conf")
}
