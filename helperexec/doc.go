// Package helperexec starts and stops a helper process, vmnetctl's own
// (`vmnetctl helper`) or vmnet-helper on macOS: Start runs it and waits for
// its ready line (helperproto.Ready), Helper.Stop ends it; procid names
// the process across restarts of the controller, so that a helper left
// running is adopted, never confused with another process that got its pid.
package helperexec
