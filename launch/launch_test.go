package launch

import (
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
)

// TestCountedByCaller: only a helper of `attach: tap` started with no
// stats interval leaves its counting to its caller.
func TestCountedByCaller(t *testing.T) {
	for _, c := range []struct {
		attach api.AttachKind
		argv   []string
		want   bool
	}{
		{api.AttachTAP, []string{"vmnetctl", "helper", "--stats-interval", "0", "--attach", "tap"}, true},
		{api.AttachTAP, []string{"vmnetctl", "helper", "--stats-interval", "5", "--attach", "tap"}, false},
		{api.AttachTAP, []string{"vmnetctl", "helper", "--attach", "tap"}, false},
		{api.AttachTAP, []string{"vmnetctl", "helper", "--stats-interval"}, false},
		{api.AttachSocket, []string{"vmnetctl", "helper", "--stats-interval", "0"}, false},
	} {
		if got := CountedByCaller(c.attach, c.argv); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.attach, c.argv, got, c.want)
		}
	}
}
