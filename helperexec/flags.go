package helperexec

// RelearnFlag is the hidden `vmnetctl helper` flag of the short-lived
// command that vmnetctl-relay runs when a restarted VMM is served on a port
// that learns its MAC: the helper's own flags and this one. A command line
// with it is not a helper (isHelperOf).
const RelearnFlag = "relearn-mac"
