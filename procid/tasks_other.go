//go:build !linux

package procid

// TaskRoom cannot tell here (ok false).
func TaskRoom() (room int, limit string, ok bool) { return 0, "", false }
