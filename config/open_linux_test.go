package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadFileOpensNoDevice: a path that names a device, even through a
// symbolic link (root reading a user's VM file on a reload), is refused
// without being opened; a FIFO with no writer does not block; a regular
// file behind a link is read.
func TestReadFileOpensNoDevice(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "dev.yaml")
	if err := os.Symlink("/dev/null", dev); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(dev); err == nil || !strings.Contains(err.Error(), "a character device") {
		t.Errorf("a link to /dev/null: %v", err)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(fifo); err == nil || !strings.Contains(err.Error(), "a FIFO") {
		t.Errorf("a FIFO: %v", err)
	}
	real := filepath.Join(dir, "real.yaml")
	if err := os.WriteFile(real, []byte("vms: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(link); err != nil || string(b) != "vms: {}\n" {
		t.Errorf("a link to a regular file: %q, %v", b, err)
	}
}
