package testutil

import (
	"runtime"
	"strings"
)

// Goroutines counts this process's goroutines whose stack holds frame,
// a function as a stack trace names it ("nd6.(*Learner)"): to check that
// a service's goroutines ended with it.
func Goroutines(frame string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, frame) {
			n++
		}
	}
	return n
}
