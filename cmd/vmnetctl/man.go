package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newManCommand writes a man page per command (for the packages; hidden).
// The pages are written here rather than with cobra/doc, whose Markdown
// renderer (blackfriday) would allocate some 200 KB at start-up in every
// process of this binary, each helper included.
func newManCommand(root *cobra.Command) *cobra.Command {
	cmd := command("man DIR", "Write the man pages of every command into DIR", cobra.ExactArgs(1),
		func(_ *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			return writeManPages(root, args[0])
		})
	cmd.Hidden = true
	return cmd
}

// writeManPages writes cmd's page and its subcommands' into dir.
func writeManPages(cmd *cobra.Command, dir string) error {
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() && !c.IsAdditionalHelpTopicCommand() {
			if err := writeManPages(c, dir); err != nil {
				return err
			}
		}
	}
	name := strings.ReplaceAll(cmd.CommandPath(), " ", "-")
	return os.WriteFile(filepath.Join(dir, name+".8"), manPage(cmd), 0o644)
}

// roff escapes text for a man page: backslashes, and a leading dot or
// quote that roff would read as a request.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			l = `\&` + l
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// manDate is the pages' date: $SOURCE_DATE_EPOCH (seconds since 1970, for
// reproducible builds: reproducible-builds.org/specs/source-date-epoch),
// else now.
func manDate() time.Time {
	if sde, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(sde, 0).UTC()
	}
	return time.Now()
}

// manPage is cmd's man page, section 8.
func manPage(cmd *cobra.Command) []byte {
	var b bytes.Buffer
	name := strings.ReplaceAll(cmd.CommandPath(), " ", "-")
	fmt.Fprintf(&b, ".TH %q 8 %q %q %q\n", strings.ToUpper(name), manDate().Format("January 2006"), "vmnetctl "+version, "vmnetctl")
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", name, roff(cmd.Short))
	fmt.Fprintf(&b, ".SH SYNOPSIS\n.B %s\n", roff(cmd.UseLine()))
	desc := cmd.Long
	if desc == "" {
		desc = cmd.Short
	}
	fmt.Fprintf(&b, ".SH DESCRIPTION\n%s\n", roff(desc))
	if f := cmd.NonInheritedFlags().FlagUsages(); f != "" {
		fmt.Fprintf(&b, ".SH OPTIONS\n.nf\n%s.fi\n", roff(f))
	}
	if f := cmd.InheritedFlags().FlagUsages(); f != "" {
		fmt.Fprintf(&b, ".SH GLOBAL OPTIONS\n.nf\n%s.fi\n", roff(f))
	}
	if cmd.Example != "" {
		fmt.Fprintf(&b, ".SH EXAMPLES\n.nf\n%s\n.fi\n", roff(cmd.Example))
	}
	var see []string
	if p := cmd.Parent(); p != nil {
		see = append(see, strings.ReplaceAll(p.CommandPath(), " ", "-")+"(8)")
	}
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			see = append(see, strings.ReplaceAll(c.CommandPath(), " ", "-")+"(8)")
		}
	}
	if len(see) > 0 {
		fmt.Fprintf(&b, ".SH SEE ALSO\n%s\n", strings.Join(see, ", "))
	}
	return b.Bytes()
}
