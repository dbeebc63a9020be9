package controller

import (
	"runtime"
)

// launchWorkers is how many helpers start at once. Starting one is mostly
// CPU (a process, and the nftables and netlink work of its port), so a few
// per CPU keep the machine busy; more only make every start slower, each
// past its neighbours' work, until none is ready in time.
func launchWorkers() int { return min(32, 4*runtime.NumCPU()) }
