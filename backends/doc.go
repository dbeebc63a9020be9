// Package backends names the platform backends and chooses this machine's.
package backends
