package coordinator

import (
	"context"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// An operator's timeout_ms is bounded before it becomes a duration: a
// number that wraps into the allowed range when multiplied (2^64 ns +
// 60 s) or past it (INT64_MAX) is refused, with the number sent.
func TestRunCheckHugeTimeoutRefused(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	op := operator(t, s)
	wraps := int64(math.MaxUint64/1_000_000) + 60_001 // × 1 ms wraps to about 60 s
	for _, ms := range []int64{wraps, math.MaxInt64, 9e15, -1} {
		stream, err := op.RunCheck(context.Background(), &pb.RunCheckRequest{Checks: []string{"gpu.ecc"}, TimeoutMs: ms})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "timeout_ms") {
			t.Errorf("timeout_ms %d: got %v, want InvalidArgument naming timeout_ms", ms, err)
		}
	}
}
