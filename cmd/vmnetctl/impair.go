package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/ops"
)

func newImpairCommand(g *globals, s streams) *cobra.Command {
	var network, loss, lossTo, lossFrom string
	var none, clear bool
	cmd := command("impair VM [--network N] (--loss P | --loss-to P --loss-from P | --none | --clear)",
		"Make a running VM's link lose frames now, in place of its VM file's impair, until --clear (root or the VM's owner)",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			o := ops.ImpairOptions{VM: args[0], Network: network, Clear: clear, Out: s.out}
			set := 0
			for _, f := range []string{"loss", "loss-to", "loss-from", "none", "clear"} {
				if cmd.Flags().Changed(f) {
					set++
				}
			}
			switch {
			case set == 0:
				return errors.New("say what the link loses: --loss P (to the VM), --loss-to and --loss-from, --none, or --clear for its VM file's")
			case (none || clear) && set > 1:
				return errors.New("--none and --clear go alone")
			case cmd.Flags().Changed("loss") && cmd.Flags().Changed("loss-to"):
				return errors.New("--loss is --loss-to: give one of them")
			}
			if !none && !clear {
				imp := &api.Impairment{}
				for _, f := range []struct {
					flag, v string
					dst     *uint32
				}{{"loss", loss, &imp.LossToVM}, {"loss-to", lossTo, &imp.LossToVM}, {"loss-from", lossFrom, &imp.LossFromVM}} {
					if !cmd.Flags().Changed(f.flag) {
						continue
					}
					v, ok := api.ParseLoss(f.v)
					if !ok {
						return fmt.Errorf("--%s %q is not a loss: a percentage from 0%% to 100%%, at most two decimals (10%%, 0.5%%)", f.flag, f.v)
					}
					*f.dst = v
				}
				o.Impair = imp
			}
			return ops.Impair(cmd.Context(), g.dir(), o)
		})
	cmd.Flags().StringVar(&network, "network", "", "the network of the VM's attachment, for a VM on several")
	cmd.Flags().StringVar(&loss, "loss", "", "lose this share of the frames to the VM (10%, 0.5%)")
	cmd.Flags().StringVar(&lossTo, "loss-to", "", "lose this share of the frames to the VM")
	cmd.Flags().StringVar(&lossFrom, "loss-from", "", "lose this share of the frames the VM sends")
	cmd.Flags().BoolVar(&none, "none", false, "lose nothing, whatever the VM file says")
	cmd.Flags().BoolVar(&clear, "clear", false, "take back what impair set: the VM file's impair applies again")
	cmd.Example = "  sudo vmnetctl impair web --network shared --loss 10%         # a tenth of web's frames lost on their way to it\n  sudo vmnetctl impair web --network shared --loss-from 100%   # cut web off\n  sudo vmnetctl impair web --network shared --clear            # its VM file's impair again"
	cmd.ValidArgsFunction = completeVMs(g)
	return cmd
}
