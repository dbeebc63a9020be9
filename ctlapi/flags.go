package ctlapi

import (
	"os"
	"time"
)

// EnvStatsInterval overrides the default helper stats interval (a Go
// duration such as "500ms"), for tests that watch rates move.
const EnvStatsInterval = "VMNETCTL_STATS_INTERVAL"

// DefaultMetricsAddr is the controller's default Prometheus endpoint.
const DefaultMetricsAddr = "127.0.0.1:9464"

// ExitWhenIdleFlag is serve's flag for Options.ExitWhenIdle.
const ExitWhenIdleFlag = "exit-when-idle"

// EnvResync sets the controller's default resync interval (a duration
// like 30s): `up` starts the controller with the environment it runs in.
const EnvResync = "VMNETCTL_RESYNC"

// DefaultResync is $VMNETCTL_RESYNC if it is a positive duration, else 30s.
func DefaultResync() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(EnvResync)); err == nil && d > 0 {
		return d
	}
	return 30 * time.Second
}

// EnvSpares sets how many relays the controller keeps started ahead of
// need for each kind of helper (controller.Options.Spares); 0 keeps none.
// For the side-by-side measures of bench/.
const EnvSpares = "VMNETCTL_SPARES"
