package statedir

import (
	"os"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

// ImpairOverride is what `vmnetctl impair` set on a VM's attachment to a
// network, in place of its VM file's `impair`: Impair nil for none at
// all. It stands until `vmnetctl impair --clear` (or `down --all`).
type ImpairOverride struct {
	VM      string          `json:"vm"`
	Network string          `json:"network"`
	Impair  *api.Impairment `json:"impair"`
	Set     time.Time       `json:"set"`
}

// ImpairOverrides reads the overrides `vmnetctl impair` recorded; none
// when there are none.
func (d Dir) ImpairOverrides() ([]ImpairOverride, error) {
	var out []ImpairOverride
	_, err := d.readJSON(impairsFile, &out)
	return out, err
}

// SaveImpairOverrides records overrides (the file goes when there are none).
func (d Dir) SaveImpairOverrides(overrides []ImpairOverride) error {
	if len(overrides) == 0 {
		if err := os.Remove(d.file(impairsFile)); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	return d.writeJSON(impairsFile, overrides)
}
