//go:build !linux || !cgo

package nvmlprobe

import (
	"errors"
	"strings"
	"testing"
)

func TestCollectUnavailable(t *testing.T) {
	t.Parallel()
	st, err := Collect()
	if st != nil || !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "NVML not available") {
		t.Fatalf("Collect = %v, %v", st, err)
	}
}
