// Package egressproxy checks what a VM's connection names against its
// egress policy: the TLS ClientHello's server name (SNI) and the HTTP
// requests' Host, before a byte reaches the server.
//
// An egress policy that lists names allows the addresses those names
// resolve to; on a CDN one address serves thousands of names, so the
// address alone would let a VM reach every one of them. The network's
// nftables table redirects a VM's TCP connections to ports 80 and 443 of
// the addresses it learned by name to this proxy (a transparent proxy: the
// connection's original destination is read back from conntrack); the
// proxy reads the ClientHello or the request, asks Config.Allow, and only
// then dials the destination and splices the two sockets. What it refuses
// it tells Config.Denied of, with the name the connection asked for.
//
// It refuses, on a name policy: a destination its owner says no VM may
// reach (Config.CheckDst); a ClientHello that is encrypted (ECH) or names
// nothing, no DNS name or a name the policy does not allow; an HTTP
// request whose Host is not allowed, on the first request of a connection
// and on every one after it (requests are taken one at a time, each read,
// written again and answered before the next is read, so that none can
// hide in another's body or after an upgrade the server refused); HTTP/2
// with prior knowledge and CONNECT, which name their destinations where it
// cannot follow; anything that is neither TLS nor HTTP/1. An upgrade to
// WebSocket passes once the server switches; any other is taken out of
// the request. A guest cannot split a ClientHello to hide its name: the
// proxy reads the stream the kernel reassembled, as the server would.
//
// It is a leaf service: it knows nothing of networks or policies beyond
// the functions it is given (gvisor-tap-vsock's pkg/services is the
// model).
package egressproxy
