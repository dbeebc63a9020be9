// Package pollset is an epoll set that waits in Go's network poller: one
// goroutine waits on it for any number of descriptors (pidfds, pipes)
// and holds no thread while it does, where a goroutine a descriptor would
// hold a stack each (procid's children and adopted processes, a
// controller's kept TAP pipes). Linux only.
package pollset
