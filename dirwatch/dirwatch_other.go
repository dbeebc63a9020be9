//go:build !linux

package dirwatch

import "iter"

// Watch is inotify's on Linux; elsewhere it cannot tell what moved, and
// callers look at every file.
type Watch struct{}

func New(string) *Watch                { return nil }
func (*Watch) Drain()                  {}
func (*Watch) Moved(path string) bool  { return true }
func (*Watch) Tells() bool             { return false }
func (*Watch) Watching() bool          { return false }
func (*Watch) Names() iter.Seq[string] { return func(func(string) bool) {} }
func (*Watch) Unknown()                {}
func (*Watch) Take()                   {}
func (*Watch) Close()                  {}
