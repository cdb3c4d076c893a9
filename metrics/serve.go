package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Handler serves what g gathers in the Prometheus text format. A failing
// collector costs its own series, not the whole scrape.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Server serves /metrics on its own listener (the agent's metrics_listen).
type Server struct {
	lis  net.Listener
	srv  *http.Server
	done chan struct{}
}

// Listen binds addr and serves g at /metrics in the background; binding
// errors are returned at once, so a taken port stops the start.
func Listen(addr string, g prometheus.Gatherer, log zerolog.Logger) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(g))
	s := &Server{lis: lis, done: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", lis.Addr().String()).Msg("metrics server stopped")
		}
	}()
	return s, nil
}

// Addr is the address served.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Shutdown stops serving, letting scrapes in progress finish until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	if err != nil {
		return fmt.Errorf("metrics shutdown: %w", err)
	}
	return nil
}
