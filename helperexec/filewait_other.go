//go:build unix && !linux

package helperexec

import "time"

// fileWait is inotify's on Linux; elsewhere a start polls.
type fileWait struct{}

func newFileWait(string) *fileWait   { return nil }
func (*fileWait) wait(time.Duration) {}
func (*fileWait) wake()              {}
func (*fileWait) close()             {}
