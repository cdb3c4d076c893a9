package membership

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// screenedStreams keeps inbound streams that end before their first byte
// from reaching memberlist. A member that dials a peer and gives up before
// writing to it (its probe deadline passed while the dial completed, which
// a loaded host does often) leaves the peer an empty stream; memberlist
// reads that as a stream without the cluster label and logs "discarding
// stream with unacceptable label" at ERR, as if a foreign pool had called.
// A stream that carries anything, labelled or not, goes on to memberlist,
// which judges its label as before.
type screenedStreams struct {
	memberlist.NodeAwareTransport
	log     zerolog.Logger
	wait    time.Duration // for the first byte: memberlist's TCP timeout
	streams chan net.Conn
	stop    chan struct{}
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*screenedStreams)(nil)

func screenStreams(t memberlist.Transport, wait time.Duration, logger zerolog.Logger) *screenedStreams {
	inner, ok := t.(memberlist.NodeAwareTransport)
	if !ok {
		inner = nodeAwareShim{t}
	}
	s := &screenedStreams{
		NodeAwareTransport: inner,
		log:                logger.With().Str("subsystem", "memberlist").Logger(),
		wait:               wait,
		streams:            make(chan net.Conn),
		stop:               make(chan struct{}),
	}
	go s.forward()
	return s
}

func (s *screenedStreams) StreamCh() <-chan net.Conn { return s.streams }

// GetAutoBindPort passes on the port the inner transport bound, 0 when it
// cannot say.
func (s *screenedStreams) GetAutoBindPort() int {
	if ap, ok := s.NodeAwareTransport.(interface{ GetAutoBindPort() int }); ok {
		return ap.GetAutoBindPort()
	}
	return 0
}

func (s *screenedStreams) Shutdown() error {
	s.once.Do(func() { close(s.stop) })
	return s.NodeAwareTransport.Shutdown()
}

func (s *screenedStreams) forward() {
	in := s.NodeAwareTransport.StreamCh()
	for {
		select {
		case c := <-in:
			go s.screen(c)
		case <-s.stop:
			return
		}
	}
}

// screen waits for the stream's first byte, then hands it on with that
// byte still to be read.
func (s *screenedStreams) screen(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(s.wait))
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err != nil {
		ev := s.log.Debug()
		if !errors.Is(err, io.EOF) {
			// Connected, then nothing for a whole TCP timeout, or reset.
			ev = s.log.Warn().Err(err)
		}
		ev.Str("from", c.RemoteAddr().String()).Msg("stream closed before its first byte: the peer gave up on it")
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	select {
	case s.streams <- peekedConn{Conn: c, r: br}:
	case <-s.stop:
		_ = c.Close()
	}
}

// peekedConn reads what was peeked before the rest of the connection.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// netTransport is the UDP/TCP transport memberlist builds when given none,
// bound the same way: a kernel-chosen port (tests) is retried when another
// process takes it for one protocol between the two binds.
func netTransport(cfg Config, logger zerolog.Logger) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{cfg.BindAddr},
		BindPort:  cfg.BindPort,
		Logger:    log.New(newLogWriter(logger), "", 0),
	}
	tries := 1
	if cfg.BindPort == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("gossip transport on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
}

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
