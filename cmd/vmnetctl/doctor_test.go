package main

import (
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// `vmnetctl doctor --json` prints the documented shape, {findings: [{check,
// status, detail, fix}], problems}, and exits 1 when there is a problem:
// here, on Linux, the nft command missing (PATH has nothing on it).
func TestDoctorJSON(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	code, out, errOut := runCLI(t, "doctor", "--json")

	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not JSON: %v\n%s\nstderr: %s", err, out, errOut)
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"findings", "problems"}) {
		t.Errorf("keys %q, want findings and problems", keys)
	}
	var findings []map[string]any
	var problems int
	if err := json.Unmarshal(raw["findings"], &findings); err != nil {
		t.Fatalf("findings: %v", err)
	}
	if err := json.Unmarshal(raw["problems"], &problems); err != nil {
		t.Fatalf("problems: %v", err)
	}
	counted := 0
	var nft map[string]any
	for _, f := range findings {
		for k, v := range f {
			if _, ok := v.(string); !ok || !slices.Contains([]string{"check", "status", "detail", "fix"}, k) {
				t.Errorf("finding %v: field %s %v, want only the strings check, status, detail, fix", f, k, v)
			}
		}
		status, _ := f["status"].(string)
		if f["check"] == "" || f["detail"] == "" || !slices.Contains([]string{"ok", "info", "warn", "fail"}, status) {
			t.Errorf("finding %v: want a check, a detail and a status of ok, info, warn, fail", f)
		}
		if status == "warn" || status == "fail" {
			counted++
			if f["fix"] == nil {
				t.Errorf("finding %v: a problem without a fix", f)
			}
		}
		if f["check"] == "nftables" {
			nft = f
		}
	}
	if problems != counted {
		t.Errorf("problems %d, but %d findings warn or fail", problems, counted)
	}
	if want := min(problems, 1); code != want {
		t.Errorf("exit status %d with %d problems, want %d", code, problems, want)
	}
	if runtime.GOOS == "linux" {
		if nft == nil || nft["status"] != "fail" || !strings.Contains(nft["fix"].(string), "apt install nftables") {
			t.Errorf("nftables without nft on PATH: %v, want a failure saying how to install it", nft)
		}
		if code != 1 {
			t.Errorf("exit status %d with nft missing, want 1", code)
		}
	}
}
