// Package testutil is the one set of test fixtures that unit, data-plane
// and end-to-end tests share:
//
//   - Missing, RequireRoot and RequireCommands: a missing prerequisite skips
//     the test, or fails it when CI=true, so that a broken CI machine cannot
//     turn green by skipping;
//   - Eventually: wait on a condition with a deadline, never a bare sleep;
//   - Golden: compare output with a file under testdata, rewritten by
//     `go test -update`;
//   - NewNS (Linux): a throwaway named network namespace with loopback up,
//     entered from Go through one library (containernetworking/plugins'
//     pkg/ns), with everything running in it killed when the test ends;
//     DHCP, DHCPServer, Ping, Listen and friends run inside it;
//   - MainWithVmnetctl and Build: the vmnetctl binary under test;
//   - Run, InRange: small checks that would otherwise be copied.
//
// It imports nothing of vmnetctl, so that the tests of any package
// (controller, helper, netplane...) can use it without an import cycle.
//
// A test binary that imports testutil gets its -update flag: such a
// package must not define a flag of that name itself.
package testutil
