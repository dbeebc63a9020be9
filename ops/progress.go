package ops

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vmnetctl/vmnetctl/ctlapi"
)

// progressEvery is how often `up` redraws its progress line.
const progressEvery = 500 * time.Millisecond

// showProgress draws the controller's progress on w, one line redrawn in
// place, until ctx is done; then it clears the line. For a terminal:
// `up --json` and output to a file or pipe draw nothing.
func showProgress(ctx context.Context, cl *Client, w io.Writer) {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	drawn := false
	for {
		select {
		case <-ctx.Done():
			if drawn {
				fmt.Fprint(w, "\r\033[K")
			}
			return
		case now := <-tick.C:
			// Bounded: a controller too busy to answer at once is
			// asked again at the next tick.
			pctx, cancel := context.WithTimeout(ctx, progressEvery)
			p, err := cl.Progress(pctx)
			cancel()
			if err == nil && p.Phase != "" {
				fmt.Fprint(w, "\r\033[K"+ProgressLine(*p, now))
				drawn = true
			}
		}
	}
}

// ProgressLine is p as one line of text: the step, how many helpers of how many
// are ready, and the slowest.
func ProgressLine(p ctlapi.Progress, now time.Time) string {
	var b strings.Builder
	b.WriteString(p.Phase)
	if p.Total > 0 {
		fmt.Fprintf(&b, ": %d of %d attachments ready", p.Ready, p.Total)
		if p.Failed > 0 {
			fmt.Fprintf(&b, ", %d failed", p.Failed)
		}
	}
	if len(p.Slow) > 0 {
		s := p.Slow[0]
		if d := now.Sub(s.Since).Truncate(time.Second); d >= 2*time.Second {
			fmt.Fprintf(&b, "; slowest %s, starting for %v", s.Attachment, d)
		}
	}
	if d := now.Sub(p.Since).Truncate(time.Second); d > 0 {
		fmt.Fprintf(&b, " (%v)", d)
	}
	return b.String()
}
