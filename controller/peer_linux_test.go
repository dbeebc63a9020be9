package controller

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// socketLive: a VMM's socket is live while bound, also when it is
// connected to the helper's (vfkit; others' connects get EPERM), and gone
// once closed (its file left behind, as qemu leaves it) or removed.
func TestSocketLive(t *testing.T) {
	d := t.TempDir()
	helper, vm := filepath.Join(d, "h.sock"), filepath.Join(d, "vm.sock")
	h, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: helper, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	v, err := net.DialUnix("unixgram", &net.UnixAddr{Name: vm, Net: "unixgram"}, &net.UnixAddr{Name: helper, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	if !socketLive(vm) {
		t.Error("a VMM's socket connected to the helper's is not live")
	}
	v.Close()
	if socketLive(vm) {
		t.Error("a closed VMM's socket (its file left) is live")
	}
	os.Remove(vm)
	if socketLive(vm) {
		t.Error("a removed socket is live")
	}
}
