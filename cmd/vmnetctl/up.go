package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newUpCommand(g *globals, s streams) *cobra.Command {
	f := &projectFlags{}
	var asJSON bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "up -f FILE... [-p PROJECT]",
		Short: "Bring up the networks and helpers of VM files, and return once every attachment is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			p, snap, nets, err := loadProject(g, f, s)
			if err != nil {
				return err
			}
			sd := statedir.Dir{Path: g.stateDir}
			// One up or down at a time per state dir; a second waits.
			lock, err := sd.LockOps()
			if err != nil {
				return err
			}
			defer lock.Unlock()
			existing, err := sd.Projects()
			if err != nil {
				return err
			}
			// Check against the other projects before changing anything.
			if _, err := controller.ComputeDesired(nets, withProject(existing, p)); err != nil {
				return err
			}
			if err := sd.SaveNetworks(*snap); err != nil {
				return err
			}
			if err := sd.SaveProject(p); err != nil {
				return err
			}
			serveArgs := []string{"--metrics-addr", metricsAddr}
			if nets.Group != "" {
				// networks.yaml's group (lima's) may use the controller's
				// API: status and args, without root.
				serveArgs = append(serveArgs, "--group", nets.Group)
			}
			resp, err := reconcile(ctx, sd, serveArgs...)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(s.out)
				enc.SetIndent("", "  ")
				return enc.Encode(resp.Status)
			}
			return printProject(s, resp, p.Name)
		},
	}
	f.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", controller.DefaultMetricsAddr, `where the controller it starts serves Prometheus /metrics ("off" for none)`)
	return cmd
}

// reconcile starts the controller if none runs and asks it to converge.
func reconcile(ctx context.Context, sd statedir.Dir, serveArgs ...string) (*controller.ReconcileResponse, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := controller.EnsureController(ctx, sd, exe, serveArgs...); err != nil {
		return nil, err
	}
	return controller.NewClient(sd).Reconcile(ctx)
}

// printProject prints the project's attachments and fails when one is not running.
func printProject(s streams, resp *controller.ReconcileResponse, project string) error {
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tNETWORK\tMAC\tATTACHMENT\tIP\tSTATE")
	var failed []string
	for _, a := range resp.Status.Attachments {
		if a.Project != project {
			continue
		}
		where := a.Socket
		if a.Attach == "tap" {
			where = "tap " + a.Tap
		}
		ip := a.IP
		if ip == "" {
			ip = "(dhcp, not yet leased)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.VM, a.Network, a.MAC, where, ip, a.State)
		if a.State != controller.StateRunning {
			failed = append(failed, fmt.Sprintf("%s/%d on %s: %s", a.VM, a.Index, a.Network, a.Error))
		}
	}
	tw.Flush()
	for _, sk := range resp.Status.Skipped {
		fmt.Fprintln(s.out, "skipped:", sk)
	}
	if len(failed) > 0 {
		return errors.New("not every attachment is running:\n" + strings.Join(failed, "\n"))
	}
	return nil
}
