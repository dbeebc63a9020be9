package procid

import (
	"io/fs"
	"testing"
)

// TestTaskRoom: the room for tasks is the least of what pid_max,
// threads-max and the cgroup's pids.max leave, each named; and on this
// machine it can be read.
func TestTaskRoom(t *testing.T) {
	reader := func(m map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if s, ok := m[p]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	// The files, as taskRoom reads them: the cgroup's directory too.
	files := func(m map[string]string) (func(string) ([]byte, error), func() (string, bool)) {
		return reader(m), func() (string, bool) { return pidsCgroup(reader(m)) }
	}
	base := map[string]string{
		"/proc/loadavg":                "0.52 0.58 0.59 3/32700 4242\n",
		"/proc/sys/kernel/pid_max":     "32768\n",
		"/proc/sys/kernel/threads-max": "192735\n",
		"/proc/self/cgroup":            "0::/user.slice/a.scope\n",
	}
	room, limit, ok := taskRoom(files(base))
	if !ok || room != 68 || limit != "32700 of kernel.pid_max 32768 in use" {
		t.Errorf("pid_max nearly full: room %d (%q), %v; want 68, pid_max named", room, limit, ok)
	}
	v2 := map[string]string{
		"/sys/fs/cgroup/user.slice/a.scope/pids.max":     "32710\n",
		"/sys/fs/cgroup/user.slice/a.scope/pids.current": "32690\n",
	}
	for k, v := range base {
		v2[k] = v
	}
	if room, limit, _ := taskRoom(files(v2)); room != 20 || limit != "32690 of the cgroup's pids.max 32710 in use" {
		t.Errorf("cgroup v2 pids.max the least: room %d (%q), want 20", room, limit)
	}
	v2["/sys/fs/cgroup/user.slice/a.scope/pids.max"] = "max\n"
	if room, _, _ := taskRoom(files(v2)); room != 68 {
		t.Errorf("pids.max \"max\": room %d, want pid_max's 68", room)
	}
	v1 := map[string]string{
		"/proc/self/cgroup":                         "8:pids:/docker/x\n7:cpu,cpuacct:/docker/x\n0::/\n",
		"/sys/fs/cgroup/pids/docker/x/pids.max":     "300\n",
		"/sys/fs/cgroup/pids/docker/x/pids.current": "295\n",
		"/proc/loadavg":                             base["/proc/loadavg"],
		"/proc/sys/kernel/pid_max":                  "4194304\n",
	}
	if room, limit, _ := taskRoom(files(v1)); room != 5 || limit != "295 of the cgroup's pids.max 300 in use" {
		t.Errorf("cgroup v1 pids: room %d (%q), want 5", room, limit)
	}
	if _, _, ok := taskRoom(files(nil)); ok {
		t.Error("nothing readable, and yet a room")
	}
	if room, limit, ok := TaskRoom(); !ok || room <= 0 {
		t.Errorf("this machine: room %d (%q), %v", room, limit, ok)
	}
}
