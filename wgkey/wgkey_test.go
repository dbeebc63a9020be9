package wgkey

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
)

func TestLoadOrCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "wireguard.key")
	// Made once, by whichever of several callers comes first.
	keys := make([]Key, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadOrCreate(path)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if k != keys[0] {
			t.Fatalf("callers got different keys: %v", keys)
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file %v (%v), want mode 0600", st, err)
	}
	again, err := LoadOrCreate(path)
	if err != nil || again != keys[0] {
		t.Errorf("second load %v (%v), want the same key", again, err)
	}
	if _, err := api.ParseWireGuardKey(again.String()); err != nil {
		t.Error(err)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadOrCreate(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key: %v, want a refusal", err)
	}
	os.WriteFile(path, []byte("secret-ish garbage\n"), 0o600)
	if _, err := LoadOrCreate(path); err == nil || strings.Contains(err.Error(), "garbage") {
		t.Errorf("bad key file: %v, want a refusal that does not print the file", err)
	}
}

// The public key of RFC 7748's test vector (Alice's key pair, section 6.1).
func TestPublic(t *testing.T) {
	priv, _ := api.ParseWireGuardKey("dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=")
	if got := Key(priv).Public().Hex(); got != "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a" {
		t.Errorf("public key %s, want RFC 7748's", got)
	}
	k, err := Generate()
	if err != nil || k[0]&7 != 0 || k[31]&128 != 0 || k[31]&64 == 0 {
		t.Errorf("generated key %x (%v) is not clamped", k, err)
	}
}
