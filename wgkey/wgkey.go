// Package wgkey is a host's WireGuard key pair: the private key, made once
// and kept where statedir.Dir.WireGuardKeyFile says, and the
// public key derived from it, which the other hosts list in networks.yaml.
package wgkey

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"golang.org/x/crypto/curve25519"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/atomicfile"
)

// Key is a Curve25519 key.
type Key [api.WireGuardKeyLen]byte

// String is the key in base64, as wg(8) and networks.yaml write it.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// Hex is the key as WireGuard's configuration protocol writes it.
func (k Key) Hex() string { return hex.EncodeToString(k[:]) }

// Public is the public key of private key k.
func (k Key) Public() Key {
	var pub Key
	p, _ := curve25519.X25519(k[:], curve25519.Basepoint) // fails only for a low-order point, which the base point is not
	copy(pub[:], p)
	return pub
}

// Generate makes a private key: 32 random bytes, clamped as Curve25519
// wants (as `wg genkey` does).
func Generate() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return k, err
	}
	k[0] &= 248
	k[31] = k[31]&127 | 64
	return k, nil
}

// LoadOrCreate is the private key in path, made there (mode 0600) the
// first time. Two processes making it at once get the same key: it is
// written aside and linked into place, which only one can do. A key file
// that others than its owner may read is refused: the key is the host's
// identity on every encrypted segment.
func LoadOrCreate(path string) (Key, error) {
	if k, err := load(path); !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	k, err := Generate()
	if err != nil {
		return k, fmt.Errorf("making this host's WireGuard key: %w", err)
	}
	if err := Place(path, []byte(k.String()+"\n")); err != nil {
		return k, fmt.Errorf("making this host's WireGuard key %s: %w", path, err)
	}
	return load(path) // another process's, if it placed one first
}

// Place puts a key file's content at path, mode 0600, in a directory made
// 0700 if missing: written aside and linked into place, so that a crash
// leaves no key there or the whole one, and of two processes placing one
// at once the first wins (the other's Place does nothing, without error).
func Place(path string, data []byte) error {
	return atomicfile.Write(path, data, atomicfile.Options{Keep: true})
}

func load(path string) (Key, error) {
	var k Key
	st, err := os.Stat(path)
	if err != nil {
		return k, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return k, fmt.Errorf("this host's WireGuard key %s may be read by others (mode %v): chmod 600 it, or delete it (and give the other hosts the new public key)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return k, fmt.Errorf("reading this host's WireGuard key: %w", err)
	}
	p, err := api.ParseWireGuardKey(string(bytes.TrimSpace(b)))
	if err != nil {
		// Not the error's text: it would print the file's content.
		return k, fmt.Errorf("%s does not hold a WireGuard key: delete it to make a new one (and give the other hosts the new public key)", path)
	}
	return Key(p), nil
}
