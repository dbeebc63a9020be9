// Package helperexec launches and talks to a helper process, vmnetctl's own
// (`vmnetctl helper`) or vmnet-helper on macOS: it passes the socket or file
// descriptor, reads the JSON line the helper prints when it is ready and the
// stats lines it logs, and stops it.
package helperexec
