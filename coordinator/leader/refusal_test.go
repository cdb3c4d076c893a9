package leader

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A refusal's address and kind survive the status (as the wire carries
// it); anything else reads as no refusal.
func TestRefusal(t *testing.T) {
	for name, tc := range map[string]struct {
		err      error
		addr     string
		electing bool
		bad      bool
	}{
		"not leader":   {err: NotLeaderError("coord-b.example:7443"), addr: "coord-b.example:7443"},
		"no leader":    {err: NoLeaderError("election"), electing: true},
		"no address":   {err: NotLeaderError(""), bad: true},
		"long address": {err: NotLeaderError(strings.Repeat("a", 300)), bad: true},
		"text only":    {err: status.Error(codes.FailedPrecondition, NotLeaderPrefix+"x:1")},
		"plain":        {err: status.Error(codes.Unavailable, "connection refused")},
		"not grpc":     {err: errors.New("boom")},
		"nil":          {},
	} {
		// Through the proto form, as a client receives it.
		err := tc.err
		if st, ok := status.FromError(err); ok && err != nil {
			err = status.FromProto(st.Proto()).Err()
		}
		addr, electing, rerr := Refusal(err)
		if addr != tc.addr || electing != tc.electing || (rerr != nil) != tc.bad {
			t.Errorf("%s: %q %v %v", name, addr, electing, rerr)
		}
	}
	if st := status.Convert(NotLeaderError("x:1")); st.Code() != codes.FailedPrecondition || st.Message() != NotLeaderPrefix+"x:1" {
		t.Errorf("message: %v %q", st.Code(), st.Message())
	}
}
