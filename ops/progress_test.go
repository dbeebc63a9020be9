package ops

import (
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// TestProgressLine: `up`'s line names the step, how many helpers are
// ready of how many, the failures, and the slowest start.
func TestProgressLine(t *testing.T) {
	since := time.Unix(1000, 0)
	p := ctlapi.Progress{Phase: "starting helpers", Since: since, Total: 3, Ready: 1, Failed: 1,
		Slow: []ctlapi.SlowStart{{Attachment: "b/0", Since: since}}}
	if line := ProgressLine(p, since.Add(10*time.Second)); !strings.Contains(line, "1 of 3 attachments ready, 1 failed; slowest b/0") {
		t.Errorf("line %q", line)
	}
}
