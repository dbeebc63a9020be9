package procid

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// TaskRoom tells how many more tasks (processes and threads) may start
// here: the least of kernel.pid_max and kernel.threads-max less the tasks
// that exist (/proc/loadavg), and of this process's cgroup's pids.max less
// its pids.current. limit names the bound that is the least; ok is false
// where none can be read. A Go program that cannot start a thread it needs
// dies (pthread_create failed: a controller at a full pid_max aborted),
// so a supervisor checks for room before it starts a process.
func TaskRoom() (room int, limit string, ok bool) {
	return taskRoom(os.ReadFile, ownPidsCgroup)
}

// ownPidsCgroup is this process's pids cgroup, read once: reading
// /proc/self/cgroup costs 90 us here, and a helper's start asks for the
// room each time.
var ownPidsCgroup = sync.OnceValues(func() (string, bool) { return pidsCgroup(os.ReadFile) })

func taskRoom(read func(string) ([]byte, error), cgroup func() (string, bool)) (room int, limit string, ok bool) {
	num := func(path string) (int, bool) {
		b, err := read(path)
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
		return n, err == nil
	}
	consider := func(r int, what string) {
		if !ok || r < room {
			room, limit, ok = r, what, true
		}
	}
	if tasks, known := loadavgTasks(read); known {
		if n, known := num("/proc/sys/kernel/pid_max"); known {
			consider(n-tasks, fmt.Sprintf("%d of kernel.pid_max %d in use", tasks, n))
		}
		if n, known := num("/proc/sys/kernel/threads-max"); known {
			consider(n-tasks, fmt.Sprintf("%d of kernel.threads-max %d in use", tasks, n))
		}
	}
	if dir, known := cgroup(); known {
		max, hasMax := num(dir + "/pids.max") // "max": no limit
		cur, hasCur := num(dir + "/pids.current")
		if hasMax && hasCur {
			consider(max-cur, fmt.Sprintf("%d of the cgroup's pids.max %d in use", cur, max))
		}
	}
	return room, limit, ok
}

// loadavgTasks is the number of tasks that exist: the fourth field of
// /proc/loadavg is running/existing.
func loadavgTasks(read func(string) ([]byte, error)) (int, bool) {
	b, err := read("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0, false
	}
	_, total, found := strings.Cut(f[3], "/")
	n, err := strconv.Atoi(total)
	return n, found && err == nil
}

// pidsCgroup is the directory of this process's pids cgroup: the
// unified hierarchy's (0::/path), else version 1's pids controller.
func pidsCgroup(read func(string) ([]byte, error)) (string, bool) {
	b, err := read("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			if _, err := read("/sys/fs/cgroup" + parts[2] + "/pids.max"); err == nil {
				return "/sys/fs/cgroup" + strings.TrimSuffix(parts[2], "/"), true
			}
		case slices.Contains(strings.Split(parts[1], ","), "pids"):
			return "/sys/fs/cgroup/pids" + strings.TrimSuffix(parts[2], "/"), true
		}
	}
	return "", false
}
