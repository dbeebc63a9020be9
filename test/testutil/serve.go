package testutil

import "net"

// ServeConns accepts connections on ln until it is closed, each handled
// by handle on a goroutine of its own and closed after it: a test
// server's accept loop, written once.
func ServeConns(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}
