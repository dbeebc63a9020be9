package statedir

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/procid"
)

// BenchmarkSaveRuntimeFleet is the controller's commit of the runtime on
// a pass that attaches one VM beside 999 that run.
func BenchmarkSaveRuntimeFleet(b *testing.B) {
	d := Dir{Path: b.TempDir()}
	var rt Runtime
	for i := range 999 {
		key := fmt.Sprintf("c%05d/0", i)
		rt.Helpers = append(rt.Helpers, HelperRecord{Key: key, VM: key[:6], Network: "fleet0", Project: "fleet", MAC: "52:55:55:12:34:56",
			Attach: "socket", Socket: "/var/lib/vmnetctl/vms/" + key[:6] + "/0.sock", Tap: "vmt-0123456789ab", Ready: `{"vmnet_mtu":1500}`,
			StartedAt: time.Now(), Proc: procid.Identity{PID: 1000 + i, StartTime: 12345, Cmdline: []string{"vmnetctl", "helper", "--network", "fleet0", "--socket", "/x"}}})
	}
	var w RuntimeWriter
	if err := w.Save(d, rt); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		rt.Helpers[i%len(rt.Helpers)].Restarts++
		if err := w.Save(d, rt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProjectsFleet is a pass's read of the recorded projects: a
// fleet of 999 VMs in one file, and one VM beside.
func BenchmarkProjectsFleet(b *testing.B) {
	d := Dir{Path: b.TempDir()}
	var vms strings.Builder
	vms.WriteString("vms:\n")
	for i := range 999 {
		fmt.Fprintf(&vms, "  c%05d:\n    networks: [{vmnet: fleet0}]\n", i)
	}
	for name, data := range map[string]string{"fleet": vms.String(), "one": "vms:\n  solo:\n    networks: [{vmnet: fleet0}]\n"} {
		if err := d.SaveProject(&Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Abs: "/srv/" + name + ".yaml", Data: []byte(data)}}}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if ps, err := d.Projects(); err != nil || len(ps) != 2 {
			b.Fatal(ps, err)
		}
	}
}

// saveOneVMProjects records n projects of one VM each: a fleet whose every
// CI job or sandbox is a project of its own.
func saveOneVMProjects(b *testing.B, d Dir, n int) {
	for i := range n {
		name := fmt.Sprintf("p%04d", i)
		data := fmt.Sprintf("vms:\n  v%04d:\n    networks: [{vmnet: fleet0}]\n", i)
		if err := d.SaveProject(&Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Abs: "/srv/" + name + ".yaml", Data: []byte(data)}}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProjectsOfOneVM is Projects with 1,000 projects of one VM.
func BenchmarkProjectsOfOneVM(b *testing.B) {
	d := New(b.TempDir())
	saveOneVMProjects(b, d, 1000)
	for b.Loop() {
		if ps, err := d.Projects(); err != nil || len(ps) != 1000 {
			b.Fatal(len(ps), err)
		}
	}
}

// BenchmarkProjectReaderOfOneVM is a pass's read of 1,000 projects of one
// VM that did not change since the last.
func BenchmarkProjectReaderOfOneVM(b *testing.B) {
	d := New(b.TempDir())
	saveOneVMProjects(b, d, 1000)
	var r ProjectReader
	for b.Loop() {
		if ps, err := r.Projects(d); err != nil || len(ps) != 1000 {
			b.Fatal(len(ps), err)
		}
	}
}

// BenchmarkSaveRuntimeProjects is the controller's commit on a pass that
// attaches or detaches a VM of a project of its own beside 999 such
// projects applied: the applied projects change by one.
func BenchmarkSaveRuntimeProjects(b *testing.B) {
	d := New(b.TempDir())
	var rt Runtime
	for i := range 1000 {
		name := fmt.Sprintf("p%04d", i)
		data := fmt.Sprintf("vms:\n  v%04d:\n    networks: [{vmnet: fleet0}]\n", i)
		rt.AppliedProjects = append(rt.AppliedProjects, &Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Abs: "/srv/" + name + ".yaml", Data: []byte(data)}}, UID: 1000, GID: 1000})
	}
	all := rt.AppliedProjects
	var w RuntimeWriter
	if err := w.Save(d, rt); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		rt.AppliedProjects = all
		if i%2 == 0 {
			rt.AppliedProjects = all[:len(all)-1]
		}
		if err := w.Save(d, rt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSaveRuntimeProjectsUnchanged is a pass beside 1,000 projects
// of one VM that changes none of them, and one helper's record: the
// projects cost a comparison each, nothing allocated.
func BenchmarkSaveRuntimeProjectsUnchanged(b *testing.B) {
	d := New(b.TempDir())
	var rt Runtime
	for i := range 1000 {
		name := fmt.Sprintf("p%04d", i)
		rt.AppliedProjects = append(rt.AppliedProjects, &Project{Name: name, Files: []ProjectFile{{Path: name + ".yaml", Data: fmt.Appendf(nil, "vms:\n  v%04d: {}\n", i)}}})
	}
	rt.Helpers = []HelperRecord{{Key: "v0000/0", VM: "v0000", Network: "fleet0", Project: "p0000"}}
	var w RuntimeWriter
	if err := w.Save(d, rt); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rt.Helpers[0].Restarts++
		if err := w.Save(d, rt); err != nil {
			b.Fatal(err)
		}
	}
}
