// Package controller is vmnetctl's daemon: it reconciles the machine to the
// recorded projects, supervises one helper per attachment, repairs what
// drifts, and serves its API (ctlapi) and metrics on sockets of its own.
// The CLI's side of the socket is package ops.
package controller
