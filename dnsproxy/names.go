package dnsproxy

import (
	"strings"

	"github.com/vmnetctl/vmnetctl/api"
)

// Domain is the zone the proxy answers itself: <vm>.vmnet.internal.
const Domain = "vmnet.internal"

// LocalName returns the VM name a query is about: the first label of
// NAME.vmnet.internal. (inZone true), or a bare single-label NAME. (a VM
// whose resolver has no search domain asks for those).
func LocalName(qname string) (name string, inZone bool, ok bool) {
	q := strings.TrimSuffix(LowerASCII(qname), ".")
	if rest, found := strings.CutSuffix(q, "."+Domain); found {
		if rest == "" || strings.Contains(rest, ".") {
			return "", true, false
		}
		return rest, true, true
	}
	if q == Domain {
		return "", true, false
	}
	if q != "" && !strings.Contains(q, ".") {
		return q, false, true
	}
	return "", false, false
}

// LowerASCII lower-cases ASCII letters only: DNS names compare
// case-insensitively in ASCII, and other bytes must stay as they are.
func LowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// ValidHostName reports whether name can be answered under Domain: one
// label of a host name's characters.
func ValidHostName(name string) bool {
	if name == "" || len(name) > 63 || strings.HasPrefix(name, "-") {
		return false
	}
	return !strings.ContainsFunc(name, func(r rune) bool { return !api.HostNameChar(r) })
}
