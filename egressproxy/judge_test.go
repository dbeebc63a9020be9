package egressproxy

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// clientHelloRecord is the first record a crypto/tls client sends with
// cfg: its ClientHello, whole.
func clientHelloRecord(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, cfg).Handshake()
		c.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// splitRecord carries record r's handshake bytes in two records, the
// first of n bytes, as a client may.
func splitRecord(r []byte, n int) []byte {
	body := r[5:]
	rec := func(b []byte) []byte {
		return append([]byte{r[0], r[1], r[2], byte(len(b) >> 8), byte(len(b))}, b...)
	}
	return append(rec(body[:n]), rec(body[n:])...)
}

// TestJudgeTLS: the first bytes of a connection get the proxy's verdict
// once they hold the whole ClientHello, one record or two, and none
// before: every shorter prefix asks for more. What is no TLS handshake
// is refused at once.
func TestJudgeTLS(t *testing.T) {
	cfg := &Config{Allow: func(_, _ netip.AddrPort, name string) bool { return name == "api.test" }}
	src, dst := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("192.0.2.1:443")
	hello := func(c *tls.Config) []byte {
		c.InsecureSkipVerify = true
		return clientHelloRecord(t, c)
	}
	allowed := hello(&tls.Config{ServerName: "api.test"})
	for _, c := range []struct {
		what  string
		first []byte
		name  string
		why   string // "" for allowed
	}{
		{"allowed", allowed, "api.test", ""},
		{"allowed, two records", splitRecord(allowed, 40), "api.test", ""},
		{"allowed, the header's first bytes alone in a record", splitRecord(allowed, 2), "api.test", ""},
		{"another name", hello(&tls.Config{ServerName: "other.test"}), "other.test", `"other.test", which the policy does not allow`},
		{"no name", hello(&tls.Config{}), "", "TLS names no name"},
		{"ECH", hello(&tls.Config{ServerName: "api.test", EncryptedClientHelloConfigList: testutil.ECHConfigList(t, "api.test"), MinVersion: tls.VersionTLS13}), "api.test", "ECH"},
	} {
		for n := 1; n < len(c.first); n++ {
			if more, name, why := cfg.JudgeTLS(c.first[:n], src, dst); !more {
				t.Fatalf("%s: judged on %d of its %d bytes: %q, %q", c.what, n, len(c.first), name, why)
			}
		}
		// Whole, and with the bytes the client sends after it.
		for _, first := range [][]byte{c.first, append(bytes.Clone(c.first), 0x14, 3, 3, 0, 1, 1)} {
			more, name, why := cfg.JudgeTLS(first, src, dst)
			if more || name != c.name || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
				t.Errorf("%s: more %v, name %q, why %q; want the name %q and %q", c.what, more, name, why, c.name, c.why)
			}
		}
	}
	for _, bad := range []string{"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n", "\x16\x03\x01\x00\x00", "\x16\x03\x01\x00\x04\x02\x00\x00\x00"} {
		if more, _, why := cfg.JudgeTLS([]byte(bad), src, dst); more || why == "" {
			t.Errorf("%q: more %v, why %q; want refused at once", bad, more, why)
		}
	}
	if more, _, why := cfg.JudgeTLS(append([]byte{0x16, 3, 1, 0x40, 0}, make([]byte, 0x4000)...), src, dst); more || why == "" {
		t.Errorf("a record of 16 KiB of zeros: more %v, why %q; want refused", more, why)
	}
	// An allowed name to a destination the proxy would not dial.
	cfg.CheckDst = func(a netip.Addr) string {
		if a == dst.Addr() {
			return "an address of the host's"
		}
		return ""
	}
	if more, name, why := cfg.JudgeTLS(allowed, src, dst); more || name != "api.test" || why != "the destination is an address of the host's" {
		t.Errorf("the allowed name to a destination it may not reach: more %v, name %q, why %q", more, name, why)
	}
}

// FuzzJudgeTLS: any first bytes get an answer without a panic, and bytes
// past the bound are never asked for more.
func FuzzJudgeTLS(f *testing.F) {
	f.Add(clientHelloRecord(f, &tls.Config{ServerName: "api.test", InsecureSkipVerify: true}))
	f.Add([]byte("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"))
	cfg := &Config{Allow: func(_, _ netip.AddrPort, name string) bool { return name == "api.test" }}
	src, dst := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("192.0.2.1:443")
	f.Fuzz(func(t *testing.T, first []byte) {
		more, _, why := cfg.JudgeTLS(first, src, dst)
		if more && why != "" {
			t.Errorf("asked for more with a verdict %q", why)
		}
		if more && len(first) > maxHello+maxHello/8 {
			t.Errorf("asked for more after %d bytes", len(first))
		}
	})
}
