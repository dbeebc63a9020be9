package testutil

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// TLSAnyName is a TLS server's configuration with a self-signed
// certificate it shows whatever name the client asks for (clients skip
// its verification): a CDN's one address serving many names.
func TLSAnyName(t testing.TB) *tls.Config {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(24 * time.Hour), DNSNames: []string{"*"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// ECHConfigList is an ECHConfigList (RFC 9849) of one X25519 key under
// publicName: with it a Go client sends an encrypted ClientHello, the
// name it asks for hidden inside.
func ECHConfigList(t testing.TB, publicName string) []byte {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var b cryptobyte.Builder
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { // the list
		b.AddUint16(0xfe0d) // the version: encrypted_client_hello
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint8(1)       // config_id
			b.AddUint16(0x0020) // DHKEM(X25519, HKDF-SHA256)
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(key.PublicKey().Bytes()) })
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
				b.AddUint16(0x0001) // HKDF-SHA256
				b.AddUint16(0x0001) // AES-128-GCM
			})
			b.AddUint8(0) // maximum_name_length
			b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(publicName)) })
			b.AddUint16(0) // no extensions
		})
	})
	return b.BytesOrPanic()
}

// ByteWriter writes a byte a TCP segment (Go sets TCP_NODELAY): a
// ClientHello or request split as a guest hiding what it names would.
type ByteWriter struct {
	Conn interface{ Write([]byte) (int, error) }
}

func (w ByteWriter) Write(b []byte) (int, error) {
	for i := range b {
		if _, err := w.Conn.Write(b[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(b), nil
}
