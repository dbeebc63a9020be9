package helperexec

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// readProgress reads how far process pid and its descendants (the nft
// and ip commands a helper runs, its cleanup child) have got: the CPU
// time they used, their own and their reaped children's, in clock ticks;
// whether one of them is runnable or in an uninterruptible wait (R or D:
// on a busy machine it waits for a CPU or for the kernel, which is not
// being stuck); and, for an error, where the helper sleeps.
func readProgress(pid int) (progress, bool) {
	var p progress
	seen := 0
	var walk func(pid int, top bool)
	walk = func(pid int, top bool) {
		if seen++; seen > 64 { // a helper has a handful
			return
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			return
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 15 {
			return
		}
		// Fields 3 (state) and 14 to 17 (utime, stime, cutime, cstime).
		for _, s := range f[11:15] {
			n, _ := strconv.ParseUint(s, 10, 64)
			p.ticks += n
		}
		if f[0] == "R" || f[0] == "D" {
			p.busy = true
		}
		if top {
			p.state = f[0]
			if w, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid)); err == nil {
				p.wchan = string(w)
			}
		}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
			for _, k := range strings.Fields(string(kids)) {
				if c, err := strconv.Atoi(k); err == nil {
					walk(c, false)
				}
			}
		}
	}
	walk(pid, true)
	return p, p.state != ""
}
