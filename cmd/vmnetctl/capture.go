package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newCaptureCommand(g *globals, s streams) *cobra.Command {
	var network, file, filter, ring string
	var count int
	var duration time.Duration
	cmd := command("capture VM [--network N] [-w FILE|-] [--filter EXPR] [--ring SIZE] [--count N] [--duration D]", "Capture the frames of a VM's port live, as pcapng (root or the VM's owner)",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			out := s.out
			switch {
			case file != "" && file != "-":
				f, err := os.Create(file)
				if err != nil {
					return err
				}
				defer f.Close()
				out = f
			case isTerminal(s.out):
				return errors.New("pcapng is not for a terminal: write it to a file (-w FILE) or pipe it (-w - | wireshark -k -i -)")
			}
			o := ops.CaptureOptions{VM: args[0], Network: network, Count: count, Duration: duration, Filter: filter, Out: out, Err: s.err}
			if ring != "" {
				n, ok := api.ParseBytes(ring)
				if !ok || n == 0 || n > 1<<30 {
					return fmt.Errorf("--ring %q is not a size like 8MiB", ring)
				}
				o.Ring = int(n)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			go func() { <-ctx.Done(); stop() }() // a second interrupt ends it at once
			return ops.Capture(ctx, g.dir(), o)
		})
	cmd.Flags().StringVar(&network, "network", "", "the network of the VM's attachment, for a VM on several")
	cmd.Flags().StringVarP(&file, "write", "w", "-", "write the capture to FILE; - for standard output")
	cmd.Flags().StringVar(&filter, "filter", "", "capture only the frames this filter passes, in tcpdump's and Wireshark's syntax (tcp port 443, icmp or arp); compiled by tcpdump")
	cmd.Flags().StringVar(&ring, "ring", "", "a flight recorder: keep the last SIZE of frames (8MiB; 64KiB to 64MiB) and write them when the VM's helper exits, its guard drops a burst of its frames (20 in a second), or --count or --duration ends it")
	cmd.Flags().IntVar(&count, "count", 0, "stop after N frames (0: when interrupted)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long (0: when interrupted)")
	cmd.Example = "  sudo vmnetctl capture web --network shared -w web.pcapng --duration 2s   # two seconds of web's frames on shared\n  sudo vmnetctl capture web -w - | wireshark -k -i -        # live, in Wireshark\n  sudo vmnetctl capture web --network shared --filter 'udp port 67 or 68' --duration 2s -w dhcp.pcapng   # its DHCP alone, two seconds\n  sudo vmnetctl capture web --network shared --ring 8MiB --duration 2s -w last.pcapng   # the last 8 MiB before web's helper exits, or its guard drops a burst (bounded here by 2 s)"
	cmd.ValidArgsFunction = completeVMs(g)
	return cmd
}

// isTerminal tells whether w is a character device: a terminal (or
// /dev/null), not a file or a pipe.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
