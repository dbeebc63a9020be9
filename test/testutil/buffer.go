package testutil

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer that a command may write while the test reads it
// (exec.Cmd's Stdout and Stderr, waited on with Eventually).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines are the lines of s that contain sub, for a failure message.
func Lines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
