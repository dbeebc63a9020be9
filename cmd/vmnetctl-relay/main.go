//go:build linux

// Command vmnetctl-relay is what a `vmnetctl helper` execs into once it
// has made the VM's port and socket: it relays frames between them with
// the same code (package relay), in a process that links little else, so
// that an idle helper holds little memory. It is not run by hand: the
// helper hands it its descriptors and options in relay.EnvSpec, and its own
// command line, which stays the process's; or the controller starts it as
// a spare (helperproto.EnvSpare), which a VM's attach hands all that to
// later, over a socket. As a TAP's cleanup child (relay.EnvDeleteLink) it
// deletes that TAP once its holder is gone; as a controller's link reaper
// (relay.EnvReaper), every TAP the controller gives it, each once its
// holders are gone.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmnetctl/vmnetctl/helperproto"
	"github.com/vmnetctl/vmnetctl/relay"
)

func main() {
	// Nobody but root traces or reads the relay: a helper that dropped
	// privileges was so already (mode 0711 keeps it so across the exec).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// Then: the helper left these to end the process for the exec.
	if v, ok := os.LookupEnv(relay.EnvDeleteLink); ok {
		// A TAP's cleanup child (relay.CleanupCommand).
		index, err := strconv.Atoi(v)
		if err == nil && len(os.Args) != 3 {
			err = fmt.Errorf("%s wants the TAP's name: %q", relay.EnvDeleteLink, os.Args)
		}
		if err == nil {
			err = relay.DeleteLinkOnEOF(index, os.Args[2], os.Getenv(relay.EnvDeleteMark), os.Stdin)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR [cleanup] %v\n", err)
			os.Exit(1)
		}
		return
	}
	if _, ok := os.LookupEnv(relay.EnvReaper); ok {
		// A controller's link reaper (relay.ReaperCommand).
		fd, err := relay.ReaperFD()
		if err == nil {
			err = relay.Reap(fd)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR [reaper] %v\n", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	var err error
	if _, spare := os.LookupEnv(helperproto.EnvSpare); spare {
		// Started ahead of need by the controller (helperexec.Spares).
		err = relay.Spare(ctx)
	} else {
		err = relay.HandedOver(ctx, os.Stdout, os.Stderr)
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR [main] %v\n", err)
		os.Exit(1)
	}
}
