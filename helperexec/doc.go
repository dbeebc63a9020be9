// Package helperexec launches and talks to a helper process, vmnetctl's own
// (`vmnetctl helper`) or vmnet-helper on macOS: it reads the JSON line the
// helper prints when it is ready (ParseReady) and the stats lines it logs
// (ParseStatsLine), and runs and stops it (Start, Helper.Stop). It is
// platform-independent; the contract is in docs/helper.md.
package helperexec
