package ops

import (
	"github.com/vmnetctl/vmnetctl/wgkey"
)

// WireGuardPublicKey is this host's WireGuard public key, the publicKey to
// list for it in networks.yaml (vxlan.hosts), from its private key
// (statedir.Dir.WireGuardKeyFile), made there if it is not yet (0600, never printed). The same
// key serves every encrypted segment of the state dir.
func WireGuardPublicKey(env Env) (string, error) {
	path, err := env.StateDir.PrepareWireGuardKey()
	if err != nil {
		return "", err
	}
	k, err := wgkey.LoadOrCreate(path)
	if err != nil {
		return "", err
	}
	return k.Public().String(), nil
}
