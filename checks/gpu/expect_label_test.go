package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/baselines"
)

// TestBaselineSKULabelIsBaselines: gpu.inventory reads the label the
// baselines name a node's SKU with, without importing the package.
func TestBaselineSKULabelIsBaselines(t *testing.T) {
	t.Parallel()
	if labelBaselineSKU != baselines.SKULabel {
		t.Errorf("gpu.inventory reads label %q, baselines write %q", labelBaselineSKU, baselines.SKULabel)
	}
}
