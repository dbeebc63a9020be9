package egressproxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// extensionECH is the encrypted_client_hello extension (RFC 9849).
const extensionECH = 0xfe0d

// clientHello is what the proxy reads of a ClientHello.
type clientHello struct {
	name string // the server name, lower case; "" for none
	ech  bool   // it carries an encrypted ClientHello
}

// errSeen stops crypto/tls once it has parsed the ClientHello.
var errSeen = errors.New("ClientHello read")

// readClientHello reads a ClientHello from r with crypto/tls's own parser
// (which takes it over several records, as a server does), stopping there:
// nothing is written back.
func readClientHello(r io.Reader) (clientHello, error) {
	var h clientHello
	seen := false
	cfg := &tls.Config{
		GetConfigForClient: func(info *tls.ClientHelloInfo) (*tls.Config, error) {
			seen = true
			h.name = strings.ToLower(strings.TrimSuffix(info.ServerName, "."))
			h.ech = slices.Contains(info.Extensions, extensionECH)
			return nil, errSeen
		},
	}
	err := tls.Server(readOnly{r}, cfg).Handshake()
	if seen {
		return h, nil
	}
	if err == nil {
		err = errors.New("no ClientHello")
	}
	return h, err
}

// readOnly is a net.Conn that reads from r and discards what is written
// (crypto/tls's alert, when the parse stops).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(b []byte) (int, error)     { return c.r.Read(b) }
func (c readOnly) Write(b []byte) (int, error)    { return len(b), nil }
func (readOnly) Close() error                     { return nil }
func (readOnly) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnly) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnly) SetDeadline(time.Time) error      { return nil }
func (readOnly) SetReadDeadline(time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(time.Time) error { return nil }
