// Command vmnetctl is a declarative network manager for virtual machines.
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], streams{in: os.Stdin, out: os.Stdout, err: os.Stderr}))
}
