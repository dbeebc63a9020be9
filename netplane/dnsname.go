package netplane

import "strings"

// DNSDomain is the zone the DNS proxy answers itself: <vm>.vmnet.internal.
const DNSDomain = "vmnet.internal"

// localName returns the VM name a query is about: the first label of
// NAME.vmnet.internal. (inZone true), or a bare single-label NAME. (a VM
// whose resolver has no search domain asks for those).
func localName(qname string) (name string, inZone bool, ok bool) {
	q := strings.TrimSuffix(asciiLower(qname), ".")
	if rest, found := strings.CutSuffix(q, "."+DNSDomain); found {
		if rest == "" || strings.Contains(rest, ".") {
			return "", true, false
		}
		return rest, true, true
	}
	if q == DNSDomain {
		return "", true, false
	}
	if q != "" && !strings.Contains(q, ".") {
		return q, false, true
	}
	return "", false, false
}

// asciiLower lower-cases ASCII letters only: DNS names compare
// case-insensitively in ASCII, and other bytes must stay as they are.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
