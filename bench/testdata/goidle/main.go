// Command goidle blocks reading its standard input until it closes, and
// does nothing else: what any Go process costs a machine while it waits,
// the floor of an idle relay (TestChurn's idle column).
package main

import (
	"os"
	"runtime/debug"
)

func main() {
	// As an idle relay: no collection while nothing happens.
	debug.SetGCPercent(-1)
	var b [1]byte
	os.Stdin.Read(b[:])
}
