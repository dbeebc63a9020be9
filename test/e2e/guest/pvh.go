package guest

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// Booting the uncompressed kernel through its PVH entry point (qemu -kernel
// with an ELF vmlinux that has the Xen PHYS32_ENTRY note) skips the
// firmware's kernel loading and, above all, the bzImage's self-decompression,
// which under TCG takes most of the boot: about 2 s instead of 10-14 s from
// qemu start to the kernel's first instruction on the CI machine.

// xenElfNotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the kernel's PVH entry.
const xenElfNotePhys32Entry = 18

// pvhKernel returns the path of the vmlinux extracted from the bzImage
// kernel, cached in cacheDir as vmlinux-<key>, if it can be booted by PVH.
func pvhKernel(kernel, kernelSum, cacheDir string) (string, error) {
	if os.Getenv("VMNETCTL_E2E_PVH") == "0" {
		return "", errors.New("disabled by VMNETCTL_E2E_PVH=0")
	}
	path := filepath.Join(cacheDir, "vmlinux-"+kernelSum[:24])
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	data, err := os.ReadFile(kernel)
	if err != nil {
		return "", err
	}
	vmlinux, err := extractVmlinux(data)
	if err != nil {
		return "", err
	}
	if err := checkPVH(vmlinux); err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	return path, writeFileAtomic(path, vmlinux)
}

// extractVmlinux returns the ELF kernel inside a bzImage: the compressed
// payload the setup header points at (boot protocol 2.08+), decompressed
// (gzip in Go; xz and zstd through the host's tools).
func extractVmlinux(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	if binary.LittleEndian.Uint16(bz[0x206:]) < 0x208 {
		return nil, errors.New("boot protocol before 2.08: no payload offset")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
	end := start + int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if start >= end || end > len(bz) {
		return nil, errors.New("bzImage payload out of range")
	}
	payload := bz[start:end]
	tool := func(name string, args ...string) ([]byte, error) {
		cmd := exec.Command(name, args...)
		cmd.Stdin = bytes.NewReader(payload)
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return out, nil
	}
	switch {
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		zr.Multistream(false)
		return io.ReadAll(zr)
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		return tool("xz", "-dc", "--single-stream")
	case bytes.HasPrefix(payload, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return tool("zstd", "-dc")
	default:
		return nil, fmt.Errorf("bzImage payload compression % x not supported", payload[:min(4, len(payload))])
	}
}

// checkPVH reports an error unless the ELF kernel has a PVH entry point.
func checkPVH(vmlinux []byte) error {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		for len(notes) >= 12 {
			namesz := int(f.ByteOrder.Uint32(notes[0:]))
			descsz := int(f.ByteOrder.Uint32(notes[4:]))
			typ := f.ByteOrder.Uint32(notes[8:])
			align4 := func(n int) int { return (n + 3) &^ 3 }
			next := 12 + align4(namesz) + align4(descsz)
			if next > len(notes) {
				break
			}
			if string(bytes.TrimRight(notes[12:12+namesz], "\x00")) == "Xen" && typ == xenElfNotePhys32Entry {
				return nil
			}
			notes = notes[next:]
		}
	}
	return errors.New("vmlinux has no PVH entry point (CONFIG_PVH)")
}
