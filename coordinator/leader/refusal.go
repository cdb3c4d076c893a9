package leader

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A follower's refusal of a campaign-changing call says, besides its
// message, in a google.rpc.ErrorInfo detail what a client should do:
// reason NOT_LEADER with the leader's address in the metadata (retry
// there), or NO_LEADER (an election is under way: retry in a moment).
// Clients read it with Refusal, never by parsing the message.
const (
	// ErrorDomain is the ErrorInfo's domain.
	ErrorDomain = "leader.fleetcheck"
	// ReasonNotLeader: the call went to a follower; MetaLeaderAddr names
	// the leader.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonNoLeader: nobody holds the lease now.
	ReasonNoLeader = "NO_LEADER"
	// MetaLeaderAddr is the metadata key of the leader's gRPC address
	// (its ha.advertise, else its listen address).
	MetaLeaderAddr = "leader_addr"
	// NotLeaderPrefix starts a NOT_LEADER refusal's message; the leader's
	// address follows.
	NotLeaderPrefix = "not the leader; the leader is "
)

// maxAddrLen bounds the address a refusal carries (and a client accepts).
const maxAddrLen = 256

// NotLeaderError is a follower's refusal naming the leader at addr:
// FailedPrecondition "not the leader; the leader is ADDR".
func NotLeaderError(addr string) error {
	return withInfo(status.New(codes.FailedPrecondition, NotLeaderPrefix+addr), ReasonNotLeader, map[string]string{MetaLeaderAddr: addr})
}

// NoLeaderError is the refusal while nobody holds the lease:
// Unavailable with msg.
func NoLeaderError(msg string) error {
	return withInfo(status.New(codes.Unavailable, msg), ReasonNoLeader, nil)
}

func withInfo(st *status.Status, reason string, meta map[string]string) error {
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta})
	if err != nil { // cannot happen for ErrorInfo; the message still says it
		return st.Err()
	}
	return d.Err()
}

// ErrBadRefusal is a NOT_LEADER refusal without a usable address.
var ErrBadRefusal = errors.New("refusal names no usable leader address")

// Refusal reads a follower's refusal from a call's error: the leader's
// address for NOT_LEADER, electing for NO_LEADER; "", false for any
// other error (a connection failure, a refusal of the call itself).
func Refusal(err error) (addr string, electing bool, _ error) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return "", false, nil
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != ErrorDomain {
			continue
		}
		switch info.GetReason() {
		case ReasonNoLeader:
			if st.Code() == codes.Unavailable {
				return "", true, nil
			}
		case ReasonNotLeader:
			if st.Code() != codes.FailedPrecondition {
				continue
			}
			a := info.GetMetadata()[MetaLeaderAddr]
			if a == "" || len(a) > maxAddrLen {
				return "", false, fmt.Errorf("%w: %q", ErrBadRefusal, a)
			}
			return a, false, nil
		}
	}
	return "", false, nil
}
