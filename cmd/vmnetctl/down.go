package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/controller"
	"github.com/vmnetctl/vmnetctl/statedir"
)

func newDownCommand(g *globals, s streams) *cobra.Command {
	f := &projectFlags{}
	var all bool
	cmd := &cobra.Command{
		Use:   "down (-f FILE... | -p PROJECT | --all)",
		Short: "Remove a project: stop its helpers, and networks nothing needs any more (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sd := statedir.Dir{Path: g.stateDir}
			var names []string
			if all {
				ps, err := sd.Projects()
				if err != nil {
					return err
				}
				for _, p := range ps {
					names = append(names, p.Name)
				}
			} else {
				name, err := projectName(g, f)
				if err != nil {
					return err
				}
				names = []string{name}
			}
			if _, err := os.Stat(sd.Path); errors.Is(err, os.ErrNotExist) {
				fmt.Fprintln(s.out, "Nothing to do: no state in", sd.Path)
				return nil
			}
			lock, err := sd.LockOps()
			if err != nil {
				return err
			}
			defer lock.Unlock()
			for _, n := range names {
				existed, err := sd.DeleteProject(n)
				if err != nil {
					return err
				}
				if existed {
					fmt.Fprintf(s.out, "Removing project %s.\n", n)
				} else {
					fmt.Fprintf(s.out, "Project %s is not up.\n", n)
				}
			}
			left, err := sd.Projects()
			if err != nil {
				return err
			}
			cl := controller.NewClient(sd)
			_, rtErr := os.Stat(sd.Path + "/runtime.json")
			if len(left) == 0 && !cl.Running(ctx) && errors.Is(rtErr, os.ErrNotExist) {
				return sd.Clean()
			}
			resp, err := reconcile(ctx, sd)
			if err != nil {
				return err
			}
			if resp.Error != "" && len(left) > 0 {
				fmt.Fprintln(s.err, "warning:", resp.Error)
			}
			if len(left) > 0 {
				return nil
			}
			// Nothing left: the controller removes everything and exits.
			deadline := time.Now().Add(30 * time.Second)
			for {
				if l, err := sd.TryLockController(); err == nil {
					l.Unlock()
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the controller did not exit after the last project was removed; see %s", sd.ControllerLog())
				}
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Fprintln(s.out, "Everything is down.")
			return sd.Clean()
		},
	}
	f.bind(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "remove every project")
	return cmd
}
