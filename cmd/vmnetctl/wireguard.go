package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vmnetctl/vmnetctl/ops"
)

// newWireGuardCommand is `vmnetctl wireguard pubkey`: this host's key for
// the networks whose underlay is encrypted (docs/multihost.md).
func newWireGuardCommand(g *globals, s streams) *cobra.Command {
	cmd := &cobra.Command{Use: "wireguard", Short: "This host's WireGuard key, for networks across hosts with an encrypted underlay"}
	pubkey := command("pubkey", "Print this host's WireGuard public key (made on first use), to list as its publicKey in vxlan.hosts",
		cobra.NoArgs, func(*cobra.Command, []string) error {
			k, err := ops.WireGuardPublicKey(g.env(s))
			if err != nil {
				return err
			}
			fmt.Fprintln(s.out, k)
			return nil
		})
	cmd.AddCommand(pubkey)
	return cmd
}
