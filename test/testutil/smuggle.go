package testutil

import (
	"strconv"
	"strings"
)

// SmuggledTail is what a smuggling test sends after a first request's
// body: a POST to api.test whose head and padding take rest bytes, then
// evil, which with the padding is that POST's body (its Content-Length).
// A server that reads the first body as its length says reads the POST
// and its body; one that reads rest bytes too many into the first body
// (the POST's head and padding, taken for the body's rest) reads evil as
// a request of its own, for whatever name evil names: the smuggling the
// egress proxy must not allow. rest must leave room for the POST's head.
func SmuggledTail(rest int, evil string) string {
	var head, pad string
	for body := 0; ; {
		// The head's length depends on the body's, the body's on the
		// head's: until they agree.
		head = "POST /2 HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + strconv.Itoa(body) + "\r\n\r\n"
		pad = strings.Repeat("p", rest-len(head))
		if len(pad)+len(evil) == body {
			break
		}
		body = len(pad) + len(evil)
	}
	return head + pad + evil
}
