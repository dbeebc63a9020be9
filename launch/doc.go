// Package launch starts the helper of one attachment (its socket, its
// command line, its record), for the controller and for `vmnetctl run`.
package launch
