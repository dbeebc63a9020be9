package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newImpairCommand(g *globals, s streams) *cobra.Command {
	var network string
	var none, clear bool
	imp := &api.Impairment{}
	// The impairments' flags: a share or a duration each, to the VM
	// (--loss, --loss-to) or from it (--loss-from).
	type share struct {
		flag, help string
		dst        *uint32
	}
	type delay struct {
		flag, help string
		dst        *time.Duration
	}
	shares := []share{
		{"loss", "lose this share of the frames to the VM (10%, 0.5%)", &imp.LossToVM},
		{"loss-to", "lose this share of the frames to the VM", &imp.LossToVM},
		{"loss-from", "lose this share of the frames the VM sends", &imp.LossFromVM},
		{"duplicate", "send this share of the frames to the VM twice", &imp.DuplicateToVM},
		{"duplicate-from", "send this share of the frames the VM sends twice", &imp.DuplicateFromVM},
		{"reorder", "send this share of the frames to the VM at once, past the delayed ones (needs --delay)", &imp.ReorderToVM},
		{"reorder-from", "send this share of the frames the VM sends at once, past the delayed ones (needs --delay-from)", &imp.ReorderFromVM},
	}
	delays := []delay{
		{"delay", "hold each frame to the VM this long (50ms)", &imp.DelayToVM},
		{"delay-from", "hold each frame the VM sends this long", &imp.DelayFromVM},
		{"jitter", "give or take this much, at random, of --delay (5ms)", &imp.JitterToVM},
		{"jitter-from", "give or take this much, at random, of --delay-from", &imp.JitterFromVM},
	}
	names := []string{"none", "clear"}
	for _, f := range shares {
		names = append(names, f.flag)
	}
	for _, f := range delays {
		names = append(names, f.flag)
	}
	shareValues := make([]string, len(shares))
	delayValues := make([]string, len(delays))
	cmd := command("impair VM [--network N] (--loss P | --delay D --jitter D | --duplicate P | --reorder P | their -from forms | --none | --clear)",
		"Make a running VM's link lose, delay, duplicate or reorder frames now, in place of its VM file's impair, until --clear (root or the VM's owner)",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			o := ops.ImpairOptions{VM: args[0], Network: network, Clear: clear, Out: s.out}
			set := 0
			for _, f := range names {
				if cmd.Flags().Changed(f) {
					set++
				}
			}
			switch {
			case set == 0:
				return errors.New("say what the link does: --loss P (to the VM), --delay D, --jitter D, --duplicate P, --reorder P (their -from forms for the frames the VM sends), --none, or --clear for its VM file's")
			case (none || clear) && set > 1:
				return errors.New("--none and --clear go alone")
			case cmd.Flags().Changed("loss") && cmd.Flags().Changed("loss-to"):
				return errors.New("--loss is --loss-to: give one of them")
			}
			if !none && !clear {
				for i, f := range shares {
					if !cmd.Flags().Changed(f.flag) {
						continue
					}
					v, ok := api.ParseLoss(shareValues[i])
					if !ok {
						what := "a share"
						if strings.HasPrefix(f.flag, "loss") {
							what = "a loss"
						}
						return fmt.Errorf("--%s %q is not %s: a percentage from 0%% to 100%%, at most two decimals (10%%, 0.5%%)", f.flag, shareValues[i], what)
					}
					*f.dst = v
				}
				for i, f := range delays {
					if !cmd.Flags().Changed(f.flag) {
						continue
					}
					d, ok := api.ParseDelay(delayValues[i])
					if !ok {
						return fmt.Errorf("--%s %q is not a delay: a duration from 0 to %v (50ms, 1.5ms, 1s)", f.flag, delayValues[i], api.MaxDelay)
					}
					*f.dst = d
				}
				if err := imp.Check(); err != nil {
					return err
				}
				o.Impair = imp
			}
			return ops.Impair(cmd.Context(), g.dir(), o)
		})
	cmd.Flags().StringVar(&network, "network", "", "the network of the VM's attachment, for a VM on several")
	for i, f := range shares {
		cmd.Flags().StringVar(&shareValues[i], f.flag, "", f.help)
	}
	for i, f := range delays {
		cmd.Flags().StringVar(&delayValues[i], f.flag, "", f.help)
	}
	cmd.Flags().BoolVar(&none, "none", false, "do nothing to the frames, whatever the VM file says")
	cmd.Flags().BoolVar(&clear, "clear", false, "take back what impair set: the VM file's impair applies again")
	cmd.Example = "  sudo vmnetctl impair web --network shared --loss 10%                # a tenth of web's frames lost on their way to it\n" +
		"  sudo vmnetctl impair web --network shared --delay 50ms --jitter 5ms # 45 to 55 ms more to web\n" +
		"  sudo vmnetctl impair web --network shared --loss-from 100%          # cut web off\n" +
		"  sudo vmnetctl impair web --network shared --clear                   # its VM file's impair again"
	cmd.ValidArgsFunction = completeVMs(g)
	return cmd
}
