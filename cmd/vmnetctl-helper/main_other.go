//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "vmnetctl-helper runs on Linux only")
	os.Exit(1)
}
