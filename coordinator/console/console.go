// Package console is the coordinator's web console: the fleet, a node,
// the campaigns and the audit log as pages, read in process from the
// coordinator's store and campaign engines (Source), never through its own
// gRPC API. Pages update themselves by polling their own URL (the part
// below the header only), and every view is a URL: filters live in the
// query string, so a view can be pasted into a ticket.
//
// Who may look: an operator with an admin certificate of the trust domain
// (checked as the gRPC operator API checks it, authz.AuthorizeOperator) or
// a token from the token file; a node certificate gets 403. Who may act:
// the same operators, only when actions are enabled, by POST with a
// per-session CSRF token from the same origin; each action goes through
// the campaign service's own path, which audits it.
package console

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
)

//go:embed web/*.html
var pagesFS embed.FS

//go:embed static
var staticFS embed.FS

// Options carry what the coordinator wires in.
type Options struct {
	Logger zerolog.Logger
	// Source is what the pages show.
	Source Source
	// Insecure serves plaintext and lets everyone in as anonymous, as the
	// coordinator's insecure mode does for gRPC.
	Insecure bool
	// TrustDomain is the operators' trust domain; required unless Insecure.
	TrustDomain string
	// Certs is the coordinator's certificate and CA pool; required unless
	// Insecure. The console serves HTTPS with them and asks for (does not
	// require) a client certificate, so token users can connect.
	Certs *pki.Reloader
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Version is shown in the footer.
	Version string
}

// Server is the console. New builds it; Start listens; Stop ends it.
type Server struct {
	cfg   Config
	opts  Options
	log   zerolog.Logger
	authz *authz.Authorizer
	toks  *tokens
	sess  *sessions
	guard *guard // bounds token guessing per host
	pages *pages
	snap  fleetCache
	mux   *http.ServeMux

	mu     sync.Mutex
	lis    net.Listener
	http   *http.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// New checks cfg (defaults filled in) and reads the token file.
func New(cfg Config, opts Options) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Source == nil {
		return nil, errors.New("console: no source")
	}
	if !opts.Insecure && opts.Certs == nil {
		return nil, errors.New("console: no certificates: the console serves HTTPS with the coordinator's (tls:) or, with insecure: true, plaintext")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	a, err := authz.New(authz.Config{TrustDomain: opts.TrustDomain, Insecure: opts.Insecure, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	toks, err := loadTokens(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	p, err := loadPages()
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	sess, err := newSessions(opts.Now)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	s := &Server{cfg: cfg, opts: opts, log: opts.Logger.With().Str("subsystem", "console").Logger(),
		authz: a, toks: toks, sess: sess, pages: p, guard: newGuard(opts.Now)}
	// Consoles polling together share one read of the nodes per refresh
	// (at most 5 s old): ten open consoles cost one read, not ten.
	s.snap.ttl = min(5*time.Second, cfg.Refresh)
	s.snap.now = opts.Now
	s.routes()
	return s, nil
}

// Handler is the console's HTTP handler (every page behind the identity
// check), for tests and benchmarks that serve it themselves.
func (s *Server) Handler() http.Handler { return s.mux }

// ReloadTokens reads the token file again (SIGHUP); on error the tokens
// in use stay and the error is returned.
func (s *Server) ReloadTokens() error {
	if err := s.toks.reload(); err != nil {
		return err
	}
	s.log.Info().Str("file", s.cfg.TokenFile).Msg("console tokens reloaded")
	return nil
}

// tokenCheckEvery is how often the token file is looked at for changes,
// as certificate files are (pki.DefaultCheckInterval).
const tokenCheckEvery = pki.DefaultCheckInterval

// Start binds the listener and serves in the background.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil {
		return errors.New("console: already started")
	}
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen: %w", err)
	}
	s.http = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: stdlog.New(debugWriter{s.log}, "", 0)}
	if !s.opts.Insecure {
		s.http.TLSConfig = s.tlsConfig()
		lis = tls.NewListener(lis, s.http.TLSConfig)
	}
	s.lis = lis
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); s.watchTokens(ctx) }()
		if err := s.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("console stopped")
		}
		cancel()
		wg.Wait()
	}()
	ev := s.log.Info().Str("addr", lis.Addr().String()).Bool("actions", s.cfg.Actions)
	if s.opts.Insecure {
		ev.Msg("console serving plaintext, everyone anonymous (insecure mode)")
	} else {
		ev.Msg("console serving https")
	}
	return nil
}

// URL is where the console serves, once started ("" before).
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return ""
	}
	scheme := "https"
	if s.opts.Insecure {
		scheme = "http"
	}
	return scheme + "://" + s.lis.Addr().String() + "/"
}

// Stop ends the listener and waits for open requests until ctx is done.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http == nil {
		return nil
	}
	err := s.http.Shutdown(ctx)
	if err != nil {
		_ = s.http.Close() // the shutdown error is the one to report
	}
	s.cancel()
	<-s.done
	s.http = nil
	return err
}

func (s *Server) watchTokens(ctx context.Context) {
	t := time.NewTicker(tokenCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.toks.changed() {
			if err := s.ReloadTokens(); err != nil {
				s.log.Error().Err(err).Msg("console tokens not reloaded; the previous ones stay")
			}
		}
	}
}

// tlsConfig serves the coordinator's current certificate and verifies a
// client certificate when one is given (tokens need none), against the
// current CA pool; as for gRPC, no session resumption skips verification.
func (s *Server) tlsConfig() *tls.Config {
	r := s.opts.Certs
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Named here too: http.Server speaks HTTP/2 only when the
		// top-level config offers it.
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:             tls.VersionTLS13,
				ClientAuth:             tls.VerifyClientCertIfGiven,
				ClientCAs:              r.CAPool(),
				Certificates:           []tls.Certificate{*r.Certificate()},
				NextProtos:             []string{"h2", "http/1.1"},
				SessionTicketsDisabled: true,
			}, nil
		},
	}
}

// debugWriter sends the HTTP server's own lines (a client that hung up
// in the handshake) to the debug log.
type debugWriter struct{ log zerolog.Logger }

func (w debugWriter) Write(p []byte) (int, error) {
	w.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
