package api

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Bad input costs bounded time and memory, and comes back briefly.
func TestInputLimits(t *testing.T) {
	// Nested aliases: ten levels of ten aliases each stand for 10^10 nodes.
	var bomb strings.Builder
	bomb.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&bomb, "a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 10), ", "))
	}
	bomb.WriteString("vms:\n  web:\n    networks: [{vmnet: shared}]\n    x: *a10\n")
	big := "vms:\n  web:\n    networks:\n      - vmnet: " + strings.Repeat("x", MaxFileSize) + "\n"
	long := "vms:\n  web:\n    networks:\n      - vmnet: " + strings.Repeat("y", 5000) + "\n"
	ctrl := "vms:\n  \"we\\e[31mb\":\n    networks: [{vmnet: shared}]\n"
	for _, tc := range []struct {
		name, data, want string
		maxLen           int
	}{
		{"alias bomb", bomb.String(), "aliases expanded", 300},
		{"too large", big, "vmnetctl reads files of at most", 300},
		{"a long value is quoted briefly", long, "yyyy… (50", 400},
		{"control bytes are escaped", ctrl, `we\x1b[31mb`, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			began := time.Now()
			_, diags := LoadVMFile("vms.yaml", []byte(tc.data), VMFileOptions{})
			took := time.Since(began)
			runtime.ReadMemStats(&after)
			err := diags.Err()
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || len(msg) > tc.maxLen {
				t.Errorf("error (%d bytes) = %.500q, want one naming %q in at most %d bytes", len(msg), msg, tc.want, tc.maxLen)
			}
			if strings.ContainsRune(msg, 0x1b) {
				t.Errorf("error carries a raw escape byte: %q", msg)
			}
			// Generous bounds: a few times the input, not its expansion.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(64<<20+4*len(tc.data)) {
				t.Errorf("parsing allocated %d bytes", alloc)
			}
			if took > 5*time.Second {
				t.Errorf("parsing took %s", took)
			}
		})
	}
}

func TestAtMostMaxShownDiagnostics(t *testing.T) {
	var ds Diagnostics
	for i := range MaxShown + 7 {
		ds = append(ds, Diagnostic{File: "f", Line: i + 1, Message: "bad"})
	}
	ve, _ := AsValidationError(ds.Err())
	if len(ve.Shown()) != MaxShown {
		t.Errorf("shown %d, want %d", len(ve.Shown()), MaxShown)
	}
	if msg := ve.Error(); !strings.HasSuffix(msg, "... and 7 more") || strings.Count(msg, "\n") != MaxShown {
		t.Errorf("error ends %q with %d lines", msg[len(msg)-40:], strings.Count(msg, "\n")+1)
	}
}
