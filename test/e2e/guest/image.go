package guest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// imageFormat is bumped whenever the image layout changes in a way the
// inputs hashed into the cache key do not show.
const imageFormat = "vmnetctl-e2e-image-v1"

// DefaultModules are the kernel modules the guest loads (with their
// dependencies, from modules.dep) unless ImageOptions.Modules says otherwise.
// Modules built into the kernel (modules.builtin) are skipped.
var DefaultModules = []string{"virtio_pci", "virtio_net"}

// ErrMissing wraps errors about missing prerequisites (no kernel, no busybox,
// no qemu): tests skip on them, or fail with CI=true (testutil.Missing).
var ErrMissing = errors.New("e2e prerequisite missing")

// setupHint is how to install what ErrMissing is about.
const setupHint = "test/setup.sh, run as root, installs qemu-system-x86, busybox-static and linux-image-amd64"

// ImageOptions selects the inputs of a guest image. Zero values pick the
// defaults described on each field.
type ImageOptions struct {
	// Kernel is the path of a vmlinuz. Default: $VMNETCTL_E2E_KERNEL, else the
	// newest /boot/vmlinuz-<ver> that has /lib/modules/<ver>/modules.dep.
	Kernel string
	// ModulesDir is /lib/modules/<ver> for Kernel. Default: derived from the
	// kernel's file name.
	ModulesDir string
	// Busybox is a statically linked busybox. Default: /bin/busybox.
	Busybox string
	// Modules to load at boot, by name. Default: DefaultModules.
	Modules []string
	// CacheDir holds built initramfs images. Default: $VMNETCTL_E2E_CACHE,
	// else <user cache dir>/vmnetctl-e2e.
	CacheDir string
}

// Image is a bootable guest: a kernel used in place and a cached base
// initramfs. One Image is shared by any number of guests.
type Image struct {
	Kernel string // path of the vmlinuz
	// BootKernel is what qemu boots: the uncompressed vmlinux extracted from
	// Kernel into the cache, booted through its PVH entry point (much faster
	// under TCG), or Kernel itself when that is not possible (PVHError says
	// why) or $VMNETCTL_E2E_PVH=0.
	BootKernel    string
	PVHError      error
	KernelVersion string        // e.g. 6.1.0-56-amd64
	Initrd        string        // base initramfs (gzip newc cpio) in the cache
	Key           string        // cache key: hash of every input
	Modules       []string      // modules in load order (dependencies first)
	Cached        bool          // Initrd was already in the cache
	BuildTime     time.Duration // time BuildImage took (hashing included)
}

// BuildImage returns the image for opts, building the initramfs into the
// cache if it is not there yet. It is safe to call from several processes at
// once (the file is written to a temporary name and renamed).
func BuildImage(opts ImageOptions) (*Image, error) {
	start := time.Now()
	if err := opts.fill(); err != nil {
		return nil, err
	}
	busybox, err := os.ReadFile(opts.Busybox)
	if err != nil {
		return nil, fmt.Errorf("%w: busybox: %v (install busybox-static)", ErrMissing, err)
	}
	kernelSum, err := hashFile(opts.Kernel)
	if err != nil {
		return nil, fmt.Errorf("%w: kernel: %v", ErrMissing, err)
	}
	mods, err := resolveModules(opts.ModulesDir, opts.Modules)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(opts.Busybox)
	if err != nil {
		return nil, err
	}

	h := sha256.New()
	field := func(name string, data []byte) {
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	field("format", []byte(imageFormat))
	field("kernel", []byte(kernelSum))
	field("busybox", busybox)
	field("applets", []byte(strings.Join(applets, "\n")))
	field("init", []byte(initScript))
	field("lib", []byte(libScript))
	field("udhcpc", []byte(udhcpcScript))
	for _, m := range mods {
		field("module "+m.name, m.data)
	}
	key := hex.EncodeToString(h.Sum(nil))[:24]

	img := &Image{
		Kernel:        opts.Kernel,
		KernelVersion: filepath.Base(opts.ModulesDir),
		Initrd:        filepath.Join(opts.CacheDir, "initramfs-"+key+".cpio.gz"),
		Key:           key,
	}
	for _, m := range mods {
		img.Modules = append(img.Modules, m.name)
	}
	img.BootKernel, img.PVHError = pvhKernel(opts.Kernel, kernelSum, opts.CacheDir)
	if img.PVHError != nil {
		img.BootKernel = opts.Kernel
	}
	if _, err := os.Stat(img.Initrd); err == nil {
		img.Cached = true
		img.BuildTime = time.Since(start)
		return img, nil
	}

	entries := []cpioEntry{
		{Name: "dev", Mode: modeDir | 0o755},
		{Name: "dev/console", Mode: modeCharDev | 0o600, Major: 5, Minor: 1},
		{Name: "dev/null", Mode: modeCharDev | 0o666, Major: 1, Minor: 3},
		{Name: "proc", Mode: modeDir | 0o755},
		{Name: "sys", Mode: modeDir | 0o755},
		{Name: "tmp", Mode: modeDir | 0o1777},
		{Name: "run", Mode: modeDir | 0o755},
		{Name: "root", Mode: modeDir | 0o700},
		{Name: "etc/resolv.conf", Mode: modeRegular | 0o644},
		{Name: "etc/passwd", Mode: modeRegular | 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{Name: "etc/group", Mode: modeRegular | 0o644, Data: []byte("root:x:0:\n")},
		{Name: "init", Mode: modeRegular | 0o755, Data: []byte(initScript)},
		{Name: "e2e/lib.sh", Mode: modeRegular | 0o644, Data: []byte(libScript)},
		{Name: "e2e/udhcpc.sh", Mode: modeRegular | 0o755, Data: []byte(udhcpcScript)},
		{Name: "bin/busybox", Mode: modeRegular | 0o755, Data: busybox},
	}
	var order strings.Builder
	for _, m := range mods {
		entries = append(entries, cpioEntry{Name: "lib/modules/" + m.name + ".ko", Mode: modeRegular | 0o644, Data: m.data})
		order.WriteString(m.name + "\n")
	}
	entries = append(entries, cpioEntry{Name: "etc/e2e/modules", Mode: modeRegular | 0o644, Data: []byte(order.String())})
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		entries = append(entries, cpioEntry{Name: a, Mode: modeSymlink | 0o777, Data: []byte("/bin/busybox")})
	}
	var buf bytes.Buffer
	if err := writeGzipCPIO(&buf, withParents(entries)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(img.Initrd, buf.Bytes()); err != nil {
		return nil, err
	}
	img.BuildTime = time.Since(start)
	return img, nil
}

func writeGzipCPIO(w io.Writer, entries []cpioEntry) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	if err := writeCPIO(zw, entries); err != nil {
		return err
	}
	return zw.Close()
}

func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func (o *ImageOptions) fill() error {
	if o.Kernel == "" {
		o.Kernel = os.Getenv("VMNETCTL_E2E_KERNEL")
	}
	if o.Kernel == "" {
		k, err := newestKernel()
		if err != nil {
			return err
		}
		o.Kernel = k
	}
	if o.ModulesDir == "" {
		ver := strings.TrimPrefix(filepath.Base(o.Kernel), "vmlinuz-")
		o.ModulesDir = filepath.Join("/lib/modules", ver)
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("VMNETCTL_E2E_CACHE")
	}
	if o.CacheDir == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		o.CacheDir = filepath.Join(dir, "vmnetctl-e2e")
	}
	return nil
}

func newestKernel() (string, error) {
	matches, _ := filepath.Glob("/boot/vmlinuz-*")
	var usable []string
	for _, m := range matches {
		ver := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", ver, "modules.dep")); err == nil {
			usable = append(usable, m)
		}
	}
	if len(usable) == 0 {
		return "", fmt.Errorf("%w: no /boot/vmlinuz-<ver> with /lib/modules/<ver>/modules.dep (install linux-image-amd64)", ErrMissing)
	}
	sort.Slice(usable, func(i, j int) bool { return versionLess(usable[i], usable[j]) })
	return usable[len(usable)-1], nil
}

// versionLess compares strings with embedded numbers numerically.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			i, j := 0, 0
			for i < len(a) && isDigit(a[i]) {
				i++
			}
			for j < len(b) && isDigit(b[j]) {
				j++
			}
			na, nb := strings.TrimLeft(a[:i], "0"), strings.TrimLeft(b[:j], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[i:], b[j:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func busyboxApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s --list-full: %v", ErrMissing, busybox, err)
	}
	var applets []string
	for _, l := range strings.Fields(string(out)) {
		applets = append(applets, strings.TrimPrefix(l, "/"))
	}
	sort.Strings(applets)
	return applets, nil
}

type module struct {
	name string
	data []byte // uncompressed .ko
}

func modName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// resolveModules returns the wanted modules and their dependencies, from
// modules.dep, in load order (dependencies first).
func resolveModules(dir string, want []string) ([]module, error) {
	depFile, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v (install linux-image-amd64)", ErrMissing, err)
	}
	defer depFile.Close()
	paths := map[string]string{}
	deps := map[string][]string{}
	sc := bufio.NewScanner(depFile)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n := modName(mod)
		paths[n] = mod
		for _, d := range strings.Fields(rest) {
			deps[n] = append(deps[n], modName(d))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[modName(l)] = true
		}
	}

	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", n)
		case 2:
			return nil
		}
		if _, ok := paths[n]; !ok {
			if builtin[n] {
				state[n] = 2
				return nil
			}
			return fmt.Errorf("%w: kernel module %s not in %s/modules.dep nor modules.builtin", ErrMissing, n, dir)
		}
		state[n] = 1
		for _, d := range deps[n] {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, n)
		return nil
	}
	for _, w := range want {
		if err := visit(strings.ReplaceAll(w, "-", "_")); err != nil {
			return nil, err
		}
	}
	var mods []module
	for _, n := range order {
		data, err := readModule(filepath.Join(dir, paths[n]))
		if err != nil {
			return nil, err
		}
		mods = append(mods, module{name: n, data: data})
	}
	return mods, nil
}

// readModule returns the uncompressed contents of a .ko, .ko.gz, .ko.xz or
// .ko.zst file (xz and zstd through the host's tools).
func readModule(path string) ([]byte, error) {
	switch {
	case strings.HasSuffix(path, ".ko"):
		return os.ReadFile(path)
	case strings.HasSuffix(path, ".gz"):
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(path, ".xz"):
		return exec.Command("xz", "-dc", path).Output()
	case strings.HasSuffix(path, ".zst"):
		return exec.Command("zstd", "-dc", path).Output()
	}
	return nil, fmt.Errorf("unknown module format: %s", path)
}

var (
	sharedOnce sync.Once
	sharedImg  *Image
	sharedErr  error
)

// SharedImage builds (or finds in the cache) the default image once per
// process and returns it. A missing prerequisite skips the test, or fails
// it with CI=true (testutil.Missing); other errors fail it.
func SharedImage(tb testing.TB) *Image {
	tb.Helper()
	sharedOnce.Do(func() { sharedImg, sharedErr = BuildImage(ImageOptions{}) })
	if errors.Is(sharedErr, ErrMissing) {
		testutil.Missing(tb, "e2e guest image: "+sharedErr.Error(), setupHint)
	}
	if sharedErr != nil {
		tb.Fatalf("e2e guest image: %v", sharedErr)
	}
	return sharedImg
}
