package egressproxy

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
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

// helloLen is how many of b's bytes hold its first handshake message, a
// ClientHello, with the records that carry it (crypto/tls reads it over
// several, as a server does): 0 while b holds only part of it. An error
// says b holds no ClientHello: a record of another type, or of another
// handshake message, or one past maxHello.
func helloLen(b []byte) (int, error) {
	const recordHeader, handshakeHeader = 5, 4
	// The handshake bytes of the records so far: how many, and the
	// message's header among them (read in place: a check that sees a
	// hello a byte a segment asks this again for each).
	bodyLen := 0
	var hdr [handshakeHeader]byte
	for off := 0; off < len(b); {
		if len(b)-off < recordHeader {
			break
		}
		if b[off] != recordTypeHandshake {
			return 0, fmt.Errorf("record type %d, not a handshake", b[off])
		}
		n := int(binary.BigEndian.Uint16(b[off+3:]))
		if n == 0 {
			return 0, errors.New("an empty handshake record")
		}
		if bodyLen+n > maxHello {
			return 0, fmt.Errorf("a ClientHello past %d bytes", maxHello)
		}
		if len(b)-off-recordHeader < n {
			break // the record is not whole yet
		}
		for i := bodyLen; i < handshakeHeader && i-bodyLen < n; i++ {
			hdr[i] = b[off+recordHeader+i-bodyLen]
		}
		bodyLen += n
		off += recordHeader + n
		if bodyLen >= handshakeHeader {
			if hdr[0] != 1 {
				return 0, fmt.Errorf("handshake message type %d, not a ClientHello", hdr[0])
			}
			want := handshakeHeader + (int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3]))
			if want > maxHello {
				return 0, fmt.Errorf("a ClientHello past %d bytes", maxHello)
			}
			if bodyLen >= want {
				return off, nil
			}
		}
	}
	if len(b) > maxHello+maxHello/8 {
		return 0, fmt.Errorf("no ClientHello in %d bytes", len(b))
	}
	return 0, nil
}
