package statedir

// wireGuardKeyFile holds this host's WireGuard private key (package
// wgkey), made on the first network whose underlay is encrypted.
const wireGuardKeyFile = "wireguard.key"

// WireGuardKeyFile is this host's WireGuard private key, 0600.
func (d Dir) WireGuardKeyFile() string { return d.file(wireGuardKeyFile) }
