// Package promserve serves what a Prometheus registry gathers: the handler
// both roles mount at /metrics, the agent's own metrics listener, and
// Series, which the exporters build their scrape-time samples with.
package promserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

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

// Series collects const metrics keyed by description and label values,
// so that two checks reporting the same series yield one sample (a
// duplicate would fail the whole scrape).
type Series struct {
	order []seriesKey
	m     map[seriesKey]*seriesVal
}

type seriesKey struct {
	desc   *prometheus.Desc
	labels string // label values joined by \xff
}

type seriesVal struct {
	typ    prometheus.ValueType
	v      float64
	labels []string
}

func NewSeries() *Series { return &Series{m: make(map[seriesKey]*seriesVal)} }

// clean makes label values valid UTF-8, which the exposition requires;
// they come from reports (check names, finding codes, components).
func clean(lv []string) []string {
	for i, s := range lv {
		if !utf8.ValidString(s) {
			lv[i] = strings.ToValidUTF8(s, "\uFFFD")
		}
	}
	return lv
}

func joinLabels(lv []string) string {
	n := 0
	for _, s := range lv {
		n += len(s) + 1
	}
	b := make([]byte, 0, n)
	for _, s := range lv {
		b = append(append(b, s...), 0xff)
	}
	return string(b)
}

// Add sets a series; the first value for a series wins.
func (s *Series) Add(d *prometheus.Desc, t prometheus.ValueType, v float64, lv ...string) {
	lv = clean(lv)
	k := seriesKey{d, joinLabels(lv)}
	if _, ok := s.m[k]; ok {
		return
	}
	s.m[k] = &seriesVal{typ: t, v: v, labels: lv}
	s.order = append(s.order, k)
}

// Inc counts into a gauge series.
func (s *Series) Inc(d *prometheus.Desc, lv ...string) {
	lv = clean(lv)
	k := seriesKey{d, joinLabels(lv)}
	if sv, ok := s.m[k]; ok {
		sv.v++
		return
	}
	s.m[k] = &seriesVal{typ: prometheus.GaugeValue, v: 1, labels: lv}
	s.order = append(s.order, k)
}

// Emit sends the series, in the order they were first set, to a Collect
// channel.
func (s *Series) Emit(ch chan<- prometheus.Metric) {
	for _, k := range s.order {
		sv := s.m[k]
		m, err := prometheus.NewConstMetric(k.desc, sv.typ, sv.v, sv.labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(k.desc, err)
		}
		ch <- m
	}
}
