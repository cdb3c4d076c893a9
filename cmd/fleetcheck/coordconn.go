//go:build !node

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/fleetcheck/fleetcheck/coordinator/leader"
)

// How the CLI reaches several coordinators (docs/ha.md): the addresses
// of --coordinator in order, the next one when a coordinator cannot be
// connected to; a follower's refusal naming the leader is retried once at
// the leader, and "no leader now" (an election) is retried with a backoff
// for up to electionWait, which covers a dead leader's replacement with
// the default lease (about 7 s).
const (
	maxCoordinators  = 16
	connectTimeout   = 5 * time.Second // per address, when there are several
	electionWait     = 10 * time.Second
	electionFirstTry = 200 * time.Millisecond
	electionMaxTry   = 2 * time.Second
)

// parseCoordinators splits --coordinator (or $FLEETCHECK_COORDINATOR):
// one address or a comma-separated list of at most 16, duplicates
// dropped.
func parseCoordinators(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		switch {
		case a == "":
			return nil, fmt.Errorf("--coordinator %q: an empty address in the list", s)
		case len(a) > 256:
			return nil, fmt.Errorf("--coordinator: address %.32q... longer than 256 bytes", a)
		}
		dup := false
		for _, o := range out {
			dup = dup || o == a
		}
		if !dup {
			out = append(out, a)
		}
	}
	if len(out) > maxCoordinators {
		return nil, fmt.Errorf("--coordinator: %d addresses, at most %d", len(out), maxCoordinators)
	}
	return out, nil
}

// coordConn is the CLI's connection to the coordinators; it serves every
// generated client (grpc.ClientConnInterface). The address in use is
// kept in f.addr, which errors name.
type coordConn struct {
	f     *opFlags
	addrs []string
	cc    *grpc.ClientConn // nil until the first call picks one
	all   []*grpc.ClientConn
	// followed is set once a refusal was followed to the leader: a call
	// is redirected at most once.
	followed bool
	// sleep waits between election retries (tests count the waits).
	sleep func(context.Context, time.Duration) error
}

var _ grpc.ClientConnInterface = (*coordConn)(nil)

// conn returns the connection to the coordinators of --coordinator (the
// caller validated the other flags).
func (f *opFlags) conn() (*coordConn, error) {
	if err := f.parseAddrs(); err != nil {
		return nil, err
	}
	if _, err := f.dialOptions(); err != nil { // refuse bad credentials before any call
		return nil, err
	}
	return &coordConn{f: f, addrs: f.addrs, sleep: sleepCtx}, nil
}

// Close closes every connection it opened.
func (c *coordConn) Close() {
	for _, cc := range c.all {
		_ = cc.Close() // the call's own error is what is returned
	}
}

func (c *coordConn) dial(addr string, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", addr, err)
	}
	c.all = append(c.all, cc)
	return cc, nil
}

// pick returns the connection in use: with one address, that one (dialed
// lazily, as gRPC does); with several, the first that connects within
// connectTimeout, else the first (its error is the call's).
func (c *coordConn) pick(ctx context.Context) (*grpc.ClientConn, error) {
	if c.cc != nil {
		return c.cc, nil
	}
	opts, err := c.f.dialOptions()
	if err != nil {
		return nil, err
	}
	if len(c.addrs) > 1 {
		var down []string
		for _, a := range c.addrs {
			cc, err := c.dial(a, opts)
			if err != nil {
				return nil, err
			}
			if connects(ctx, cc, connectTimeout) {
				c.cc, c.f.addr = cc, a
				return cc, nil
			}
			down = append(down, a)
		}
		c.f.unreachable = down[1:]
	}
	cc, err := c.dial(c.addrs[0], opts)
	if err != nil {
		return nil, err
	}
	c.cc, c.f.addr = cc, c.addrs[0]
	return cc, nil
}

// connects reports whether cc becomes ready within d.
func connects(ctx context.Context, cc *grpc.ClientConn, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cc.Connect()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure, connectivity.Shutdown:
			return false
		}
		if !cc.WaitForStateChange(ctx, s) {
			return false
		}
	}
}

// follow switches to the leader a follower named, with the same
// credentials; the leader's certificate must hold its address's name and
// be a coordinator of the operator's trust domain.
func (c *coordConn) follow(addr string) (*grpc.ClientConn, error) {
	c.followed = true
	opts, err := c.f.leaderDialOptions()
	if err != nil {
		return nil, fmt.Errorf("the leader is %s, not followed: %w", addr, err)
	}
	cc, err := c.dial(addr, opts)
	if err != nil {
		return nil, err
	}
	c.cc, c.f.addr, c.f.atLeader = cc, addr, true
	return cc, nil
}

// Invoke runs a unary call: at the leader when a follower names it, and
// again while an election is under way.
func (c *coordConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc, err := c.pick(ctx)
	if err != nil {
		return err
	}
	wait, waited := electionFirstTry, time.Duration(0)
	for {
		err := cc.Invoke(ctx, method, args, reply, opts...)
		addr, electing, rerr := leader.Refusal(err)
		switch {
		case rerr != nil:
			return err
		case addr != "" && !c.followed && addr != c.f.addr:
			if cc, err = c.follow(addr); err != nil {
				return err
			}
			continue
		case electing && waited+wait <= electionWait:
			if serr := c.sleep(ctx, wait); serr != nil {
				return err
			}
			waited += wait
			wait = min(2*wait, electionMaxTry)
			continue
		}
		return err
	}
}

// NewStream opens a stream on the connection in use (streams are reads:
// nothing to redirect).
func (c *coordConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, err := c.pick(ctx)
	if err != nil {
		return nil, err
	}
	return cc.NewStream(ctx, desc, method, opts...)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errNoTrustDomain: a leader named by a follower is only followed when
// its certificate can be held to the operator's trust domain.
var errNoTrustDomain = errors.New("the operator certificate names no trust domain: give --trust-domain, or --coordinator with the leader's address")
