// Package ctlapi is the controller's contract with its clients: the JSON
// of its socket's API (status, progress, checks), of its events file, and
// the flags and environment it is started with.
package ctlapi
