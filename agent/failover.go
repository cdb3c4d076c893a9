package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strings"
	"time"
)

// coordinatorAddrs is what the config names: coordinators:, or the one
// coordinator:.
func (c *Config) coordinatorAddrs() []string {
	if len(c.Coordinators) > 0 {
		return c.Coordinators
	}
	if c.Coordinator == "" {
		return nil
	}
	return []string{c.Coordinator}
}

// validateCoordinators checks coordinator: or coordinators:, not both,
// each entry host:port or a gRPC target, none twice.
func (c *Config) validateCoordinators() error {
	if len(c.Coordinators) > 0 {
		if err := rangeCoordinators.Check("coordinators", len(c.Coordinators)); err != nil {
			return err
		}
	}
	switch {
	case c.Coordinator != "" && len(c.Coordinators) > 0:
		return errors.New("coordinator and coordinators: set one (coordinators: [a, b, c] for several)")
	case c.Coordinator == "" && len(c.Coordinators) == 0:
		return errors.New("coordinator: the coordinator's address (host:port) is required (or coordinators: [a, b, c])")
	}
	key := "coordinator"
	if len(c.Coordinators) > 0 {
		key = "coordinators"
	}
	seen := map[string]bool{}
	for _, a := range c.coordinatorAddrs() {
		if a == "" {
			return fmt.Errorf("%s: an empty address", key)
		}
		if seen[a] {
			return fmt.Errorf("%s: %q twice", key, a)
		}
		seen[a] = true
		if strings.Contains(a, "://") {
			continue // a gRPC target (dns:///name:port): gRPC checks it
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%s %q: want host:port: %v", key, a, err)
		}
	}
	return nil
}

// endpoint is one coordinator to try: a configured address, or one of the
// addresses its host name resolves to.
type endpoint struct {
	addr      string // as configured, for logs
	target    string // the gRPC target dialled
	authority string // the name TLS checks, when target is a resolved IP
}

func (e endpoint) String() string {
	if e.authority != "" {
		return e.addr + " (" + strings.TrimPrefix(e.target, "passthrough:///") + ")"
	}
	return e.addr
}

// lookupFunc resolves a host name (net.DefaultResolver.LookupHost; tests
// answer for a test name).
type lookupFunc func(ctx context.Context, host string) ([]string, error)

// withLookup replaces the resolver (tests).
func withLookup(f lookupFunc) Option { return func(o *options) { o.lookup = f } }

// lookupTimeout bounds one name's resolution before a round of attempts.
const lookupTimeout = 5 * time.Second

// endpoints expands the configured addresses into what to try, in order:
// a name that resolves to several addresses (one DNS name for every
// coordinator) gives one endpoint per address, sorted, dialled by IP and
// checked under the name; an IP or a gRPC target stays one. A name that
// does not resolve stays too, so that the attempt's error names it.
func endpoints(ctx context.Context, addrs []string, lookup lookupFunc) []endpoint {
	var out []endpoint
	for _, a := range addrs {
		if strings.Contains(a, "://") {
			out = append(out, endpoint{addr: a, target: a})
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || net.ParseIP(host) != nil {
			out = append(out, endpoint{addr: a, target: "passthrough:///" + a})
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		ips, err := lookup(lctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			out = append(out, endpoint{addr: a, target: a})
			continue
		}
		slices.Sort(ips)
		for _, ip := range slices.Compact(ips) {
			out = append(out, endpoint{addr: a, target: "passthrough:///" + net.JoinHostPort(ip, port), authority: a})
		}
	}
	return out
}

// firstEndpoint spreads a fleet over its coordinators: each node starts
// at its own place in the list, the same one at every start.
func firstEndpoint(node string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(node)) // a hash never fails
	return int(h.Sum32() % uint32(n))
}

// rotation walks the endpoints: after each attempt the next one, so a
// dead coordinator is left at once for the others. The backoff grows with
// whole rounds of failures, not single ones: the move to another
// coordinator comes after a short wait, while a fleet whose every
// coordinator is down still backs off.
type rotation struct {
	node   string
	addrs  []string
	lookup lookupFunc
	eps    []endpoint
	next   int
	// picked counts picks since the names were last resolved; failed,
	// attempts since the last healthy session.
	picked, failed int
}

// pick returns the endpoint to try now. Names are resolved afresh once
// per round, so a coordinator added to DNS is found and a removed one
// dropped.
func (r *rotation) pick(ctx context.Context) endpoint {
	if r.eps == nil || r.picked >= len(r.eps) {
		first := r.eps == nil
		r.eps, r.picked = endpoints(ctx, r.addrs, r.lookup), 0
		if first {
			r.next = firstEndpoint(r.node, len(r.eps))
		}
	}
	r.next %= len(r.eps)
	r.picked++
	return r.eps[r.next]
}

// done records that the attempt on the picked endpoint ended, healthy
// (welcomed and lasted) or not, and returns the backoff's attempt number
// for the wait before the next one.
func (r *rotation) done(healthy bool) int {
	if healthy {
		r.failed = 0
	}
	round := r.failed / max(len(r.eps), 1)
	r.failed++
	r.next++
	return round
}
