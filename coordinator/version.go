package coordinator

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/proto/version"
)

// ProtocolVersion is the protocol this coordinator speaks.
const ProtocolVersion = version.Protocol

// ErrProtocol is wrapped by every protocol-version refusal.
var ErrProtocol = errors.New("protocol version refused")

// parseVersion reads "MAJOR.MINOR".
func parseVersion(v string) (major, minor int, ok bool) {
	a, b, found := strings.Cut(v, ".")
	if !found {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || major < 0 || minor < 0 || major > 1000 || minor > 1000 {
		return 0, 0, false
	}
	return major, minor, true
}

// checkProtocol says whether a coordinator speaking ours accepts an agent
// speaking agent: the same major, and a minor at most one apart.
func checkProtocol(ours, agent string) error {
	cm, cn, ok := parseVersion(ours)
	if !ok {
		return fmt.Errorf("%w: coordinator protocol %q is not MAJOR.MINOR", ErrProtocol, ours)
	}
	lo := max(cn-1, 0)
	hi := cn + 1
	accepts := fmt.Sprintf("coordinator speaks %d.x (%s), accepts %d.%d–%d.%d", cm, ours, cm, lo, cm, hi)
	am, an, ok := parseVersion(agent)
	switch {
	case !ok:
		return fmt.Errorf("%w: agent protocol %q is not MAJOR.MINOR; %s", ErrProtocol, agent, accepts)
	case am < cm || am == cm && an < lo:
		return fmt.Errorf("%w: agent protocol %s too old; %s", ErrProtocol, agent, accepts)
	case am > cm || an > hi:
		return fmt.Errorf("%w: agent protocol %s too new; %s", ErrProtocol, agent, accepts)
	}
	return nil
}

// CheckProtocol says whether this coordinator accepts an agent that speaks
// the given protocol version, and if not, why.
func CheckProtocol(agent string) error { return checkProtocol(ProtocolVersion, agent) }
