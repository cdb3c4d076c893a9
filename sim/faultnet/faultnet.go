// Package faultnet is a memberlist network with faults, for tests and the
// demo: partitions, members that go down, counted drops.
package faultnet

import (
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network cuts gossip between members for tests and demo drills: it
// wraps each member's transport and drops packets and refuses streams
// between the two sides of a partition, and towards members whose transport
// has shut down (as a dead host would). Wrap every member of the pool with
// the same Network; addresses are the advertised "ip:port".
//
// It also makes memberlist.MockNetwork usable with members that stop: a mock
// send to a stopped member would otherwise block the sender for ever.
type Network struct {
	mu      sync.Mutex
	cut     map[string]bool // one side of the partition; the rest is the other
	down    map[string]bool
	closed  chan struct{}
	once    sync.Once
	dropped atomic.Uint64
	refused atomic.Uint64
	// Counts of what did pass, so a test can wait until gossip ran rather
	// than sleep and hope it did.
	delivered atomic.Uint64
	dialed    atomic.Uint64
}

// New returns a Network with no partition. Close it after
// the members that use it have shut down.
func New() *Network {
	return &Network{
		cut:    make(map[string]bool),
		down:   make(map[string]bool),
		closed: make(chan struct{}),
	}
}

// Partition puts the given member addresses on one side and every other
// member on the other, replacing any earlier partition. Partition(addr)
// isolates one member.
func (f *Network) Partition(addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = make(map[string]bool, len(addrs))
	for _, a := range addrs {
		f.cut[a] = true
	}
}

// Heal removes the partition.
func (f *Network) Heal() {
	f.Partition()
}

// Dropped counts the packets dropped so far.
func (f *Network) Dropped() uint64 { return f.dropped.Load() }

// Refused counts the stream connections refused so far.
func (f *Network) Refused() uint64 { return f.refused.Load() }

// Delivered counts the packets passed on to a member.
func (f *Network) Delivered() uint64 { return f.delivered.Load() }

// Dialed counts the streams (push-pull, joins) opened between members.
func (f *Network) Dialed() uint64 { return f.dialed.Load() }

// Close stops the goroutines that keep draining stopped members' transports.
func (f *Network) Close() {
	f.once.Do(func() { close(f.closed) })
}

// blocked reports whether traffic between from and to is cut. An empty
// address (not yet known) is never cut.
func (f *Network) blocked(from, to string) bool {
	if from == "" || to == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[from] || f.down[to] {
		return true
	}
	return f.cut[from] != f.cut[to]
}

// setDown marks the member at addr stopped or (re)started.
func (f *Network) setDown(addr string, down bool) {
	if addr == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if down {
		f.down[addr] = true
	} else {
		delete(f.down, addr)
	}
}

// Wrap returns t with this network's faults applied. Use the result as
// Config.Transport.
func (f *Network) Wrap(t memberlist.Transport) memberlist.NodeAwareTransport {
	inner, ok := t.(memberlist.NodeAwareTransport)
	if !ok {
		inner = nodeAwareShim{t}
	}
	ft := &faultTransport{
		net:      f,
		inner:    inner,
		packets:  make(chan *memberlist.Packet, packetQueue),
		streams:  make(chan net.Conn),
		shutdown: make(chan struct{}),
	}
	go ft.forwardPackets()
	go ft.forwardStreams()
	return ft
}

// packetQueue is how many inbound packets a wrapped transport holds for
// memberlist before it drops more.
const packetQueue = 1024

// nodeAwareShim lets a plain Transport be wrapped.
type nodeAwareShim struct {
	memberlist.Transport
}

func (s nodeAwareShim) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return s.WriteTo(b, a.Addr)
}

func (s nodeAwareShim) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return s.DialTimeout(a.Addr, d)
}

// faultTransport is one member's view of a Network.
type faultTransport struct {
	net      *Network
	inner    memberlist.NodeAwareTransport
	self     atomic.Pointer[string] // advertised address, once memberlist asked for it
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	shutdown chan struct{}
	once     sync.Once
}

var _ memberlist.NodeAwareTransport = (*faultTransport)(nil)

func (t *faultTransport) selfAddr() string {
	if s := t.self.Load(); s != nil {
		return *s
	}
	return ""
}

func (t *faultTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	addr, p, err := t.inner.FinalAdvertiseAddr(ip, port)
	if err != nil {
		return nil, 0, err
	}
	self := net.JoinHostPort(addr.String(), fmt.Sprint(p))
	t.self.Store(&self)
	// A member restarted on the address of a stopped one is reachable again.
	if !t.stopped() {
		t.net.setDown(self, false)
	}
	return addr, p, nil
}

// GetAutoBindPort passes on the port a wrapped NetTransport bound, so that a
// Pool given this transport advertises it; 0 when the inner one cannot say.
func (t *faultTransport) GetAutoBindPort() int {
	if ap, ok := t.inner.(interface{ GetAutoBindPort() int }); ok {
		return ap.GetAutoBindPort()
	}
	return 0
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *faultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.net.blocked(t.selfAddr(), a.Addr) {
		// Like UDP into a partition: gone without an error.
		t.net.dropped.Add(1)
		return time.Now(), nil
	}
	return t.inner.WriteToAddress(b, a)
}

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *faultTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.net.blocked(t.selfAddr(), a.Addr) {
		t.net.refused.Add(1)
		return nil, fmt.Errorf("fault network: %s unreachable from %s", a.Addr, t.selfAddr())
	}
	t.net.dialed.Add(1)
	return t.inner.DialAddressTimeout(a, timeout)
}

func (t *faultTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *faultTransport) StreamCh() <-chan net.Conn           { return t.streams }

func (t *faultTransport) Shutdown() error {
	t.once.Do(func() {
		close(t.shutdown)
		t.net.setDown(t.selfAddr(), true)
	})
	return t.inner.Shutdown()
}

func (t *faultTransport) stopped() bool {
	select {
	case <-t.shutdown:
		return true
	default:
		return false
	}
}

// forwardPackets passes inbound packets on unless they cross the partition.
// It never blocks on memberlist: a full queue drops the packet, as a full
// UDP socket buffer would. That also breaks the cycle in which two members'
// packet readers each wait to hand the other an ack over
// memberlist.MockNetwork's unbuffered channels. It keeps draining after
// Shutdown, until the Network closes, so that no sender blocks on a
// stopped member.
func (t *faultTransport) forwardPackets() {
	in := t.inner.PacketCh()
	for {
		select {
		case p := <-in:
			if t.stopped() || t.net.blocked(p.From.String(), t.selfAddr()) {
				t.net.dropped.Add(1)
				continue
			}
			select {
			case t.packets <- p:
				t.net.delivered.Add(1)
			default:
				t.net.dropped.Add(1)
			}
		case <-t.net.closed:
			return
		}
	}
}

// forwardStreams passes inbound streams on. Their source is not known here
// (an ephemeral port or a pipe), so partitions cut streams on the dialling
// side, in DialAddressTimeout.
func (t *faultTransport) forwardStreams() {
	in := t.inner.StreamCh()
	for {
		select {
		case c := <-in:
			if t.stopped() {
				_ = c.Close()
				continue
			}
			select {
			case t.streams <- c:
			case <-t.shutdown:
				_ = c.Close()
			case <-t.net.closed:
				_ = c.Close()
				return
			}
		case <-t.net.closed:
			return
		}
	}
}

// LoopbackTransport is a real UDP/TCP transport on 127.0.0.1 (a port the
// kernel picks) behind this network's faults, so that the demo and the
// integration tests can partition real sockets. Its log lines go to logger
// (membership.MemberlistLogger makes one that feeds zerolog).
func (f *Network) LoopbackTransport(logger *log.Logger) (memberlist.NodeAwareTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("loopback gossip transport: %w", err)
	}
	return f.Wrap(nt), nil
}
