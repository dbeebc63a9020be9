package ops

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// TestReadInputBounded: what validate, plan and up read goes through a
// limit. A 50 MB VM file or networks.yaml is refused as too large after
// reading just past the limit (fast, with a few MiB allocated, not 50);
// /dev/zero and a FIFO with no writer are refused as not regular files,
// at once; each error names the file. A file of exactly the limit is read.
func TestReadInputBounded(t *testing.T) {
	dir := t.TempDir()
	nets := filepath.Join(dir, "networks.yaml")
	os.WriteFile(nets, []byte("vmnet: {}\n"), 0o644)
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("vms:\n  a: {}\n# "))
	f.Truncate(50 << 20) // sparse: 50 MB to read, nothing to write
	f.Close()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	limit := filepath.Join(dir, "limit.yaml")
	os.WriteFile(limit, append([]byte("vms: {}\n#"), make([]byte, api.MaxFileSize-9)...), 0o644)

	for _, tc := range []struct {
		name, networks, file, want string
	}{
		{"a 50 MB VM file", nets, big, "big.yaml is larger than 1048576 bytes"},
		{"a 50 MB networks.yaml", big, limit, "big.yaml is larger than 1048576 bytes"},
		{"/dev/zero as a VM file", nets, "/dev/zero", "/dev/zero is not a regular file (a character device)"},
		{"/dev/zero as networks.yaml", "/dev/zero", limit, "/dev/zero is not a regular file"},
		{"a FIFO", nets, fifo, "fifo.yaml is not a regular file (a FIFO)"},
		{"exactly the limit", nets, limit, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := ReadInput(tc.networks, []string{tc.file}, "", "")
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("allocated %d bytes", alloc)
			}
			if took > 2*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}
