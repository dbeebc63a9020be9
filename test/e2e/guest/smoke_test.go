package guest

import (
	"testing"
)

func TestSmokeBoot(t *testing.T) {
	img := SharedImage(t)
	t.Logf("image %+v", img)
	s := NewScript().Report("uname", "uname -r").Report("ifs", "ls /sys/class/net | tr '\\n' ' '").LinkUp("eth0").Addr("eth0", "10.0.0.2/24")
	r := Run(t, Config{Name: "smoke", Script: s, NetArgs: []string{"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0,mac=" + MAC(1)}})
	t.Logf("boot %v elapsed %v values %v", r.BootTime, r.Elapsed, r.Values)
	t.Log(r.Console)
}
