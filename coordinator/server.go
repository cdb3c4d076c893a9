// Package coordinator is the fleet's centre: agents stream in over gRPC
// (AgentService.Connect), operators call OperatorService, and every result,
// node state and event lands in the store before it is acknowledged.
//
// Scale: one goroutine pair per agent stream (receive and send), a bounded
// send queue per stream, and no global lock held while sending or storing:
// a dispatch to 10,000 agents is 10,000 non-blocking queue writes.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// ErrNoTransportSecurity is returned by New when the config is not marked
// insecure and no transport credentials were given.
var ErrNoTransportSecurity = errors.New("no transport credentials: set insecure: true to serve plaintext gRPC, or configure TLS")

// Options carry what the caller wires in.
type Options struct {
	Logger zerolog.Logger
	// Version is the coordinator's build version, sent in Welcome.
	Version string
	// Credentials secure the gRPC listener; nil needs Config.Insecure.
	Credentials credentials.TransportCredentials
	// UnaryInterceptors and StreamInterceptors run, in order, before the
	// services (authorization, metrics).
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
	// GRPCOptions are appended to the gRPC server's options.
	GRPCOptions []grpc.ServerOption
	// Identify finds a caller's identity (default PeerIdentity).
	Identify IdentifyFunc
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics, when set, receives measurements as they happen; the rest
	// of what /metrics shows is read from Stats when scraped.
	Metrics Metrics
	// Fleet is the fleet campaigns run on; nil serves baselines only.
	Fleet kit.Fleet
	// CampaignClock is the campaigns' clock (default the wall clock; a
	// simulated fleet's virtual clock in tests).
	CampaignClock kit.Clock
	// Drain overrides the drain adapter the config names.
	Drain drain.Adapter
	// Gossip, when set, adjusts the gossip pool's configuration before it
	// starts (tests: transport, timings).
	Gossip func(*membership.Config)
	// Refusals bounds and counts refusals (Secure sets it; default: its own).
	Refusals *Refusals
	// Certs is the certificate reloader Secure made; the web console
	// serves HTTPS with it.
	Certs *pki.Reloader
}

// Metrics receives the coordinator's measurements that a snapshot of
// counters cannot give. Its methods must not block.
type Metrics interface {
	// StoreCommit is called after each committed batch of results with
	// its size and how long the transaction took.
	StoreCommit(results int, took time.Duration)
}

// Server is a coordinator. New builds it, Start opens the store and the
// listeners, Stop ends it; Serve does all three.
type Server struct {
	cfg  Config
	opts Options
	log  zerolog.Logger
	now  func() time.Time

	mux   *http.ServeMux
	ready atomic.Bool

	reg   *registry
	works *workTable
	acts  *actionTable // RunAction calls waiting for their agent

	// ingesting holds a token per result between its arrival and its ack,
	// across all streams (maxIngesting).
	ingesting chan struct{}

	acked, duplicates, refused atomic.Uint64

	refusalMu sync.Mutex
	refusals  map[string]time.Time // identity and claimed node -> last refusal event

	mu        sync.Mutex // guards the fields below, set by Start and Stop
	started   bool
	stopped   bool
	store     *store.Store
	grpc      *grpc.Server
	http      *http.Server
	grpcLis   net.Listener
	httpLis   net.Listener
	startedAt time.Time
	bgCancel  context.CancelFunc
	// live is the pause watcher's; graceDone the sweeper's.
	live      *liveness
	graceDone bool
	bg        sync.WaitGroup
	serving   sync.WaitGroup

	// stopping is closed when Stop begins: streams then end without
	// marking their nodes unreachable (the coordinator left, not them).
	stopping chan struct{}

	camp *campaigns // the campaign engines, set by Start

	// holder names this coordinator process in the store (node stream
	// owners) and in the leader lease; routeAddr is where the others
	// reach it (ha.advertise, else the bound gRPC address), set by Start
	// before anything is served. routes calls them (routing.go).
	holder    string
	routeAddr string
	routes    *routes

	// stale holds the multi-node runs of earlier leaders still to be
	// called off, by node (stalemulti.go).
	stale staleMultis

	console *console.Server // the web console; nil when off

	gossip atomic.Pointer[membership.Pool] // nil when gossip is off
	// gossipDeaths waits out each gossip death before believing it (gossip.go).
	gossipDeaths *deathConfirms
	keyOps       *keyOpTable
}

// New checks the config and builds a server; nothing is opened yet.
func New(cfg Config, opts Options) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Insecure && opts.Credentials == nil {
		return nil, fmt.Errorf("coordinator: %w", ErrNoTransportSecurity)
	}
	if opts.Identify == nil {
		opts.Identify = PeerIdentity
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Refusals == nil {
		opts.Refusals = NewRefusals(opts.Logger, opts.Now)
	}
	s := &Server{
		cfg:      cfg,
		opts:     opts,
		log:      opts.Logger,
		now:      opts.Now,
		mux:      http.NewServeMux(),
		reg:      newRegistry(),
		works:    newWorkTable(),
		acts:     newActionTable(),
		keyOps:   newKeyOpTable(),
		refusals: make(map[string]time.Time),
		stopping: make(chan struct{}),

		ingesting: make(chan struct{}, maxIngesting),
		holder:    leader.DefaultHolder(),
	}
	s.routes = newRoutes(s)
	s.mux.HandleFunc("/healthz", s.healthz)
	return s, nil
}

// HTTPHandler serves /healthz, and whatever was added to HTTPMux.
func (s *Server) HTTPHandler() http.Handler { return s.mux }

// HTTPMux is the HTTP server's mux, so /metrics can be mounted on it.
func (s *Server) HTTPMux() *http.ServeMux { return s.mux }

// healthz says 503 until the store is open and recovered, then 200.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not serving")
		return
	}
	fmt.Fprintln(w, "ok")
}

// Ready reports whether the store is open and recovered.
func (s *Server) Ready() bool { return s.ready.Load() }

// GRPCAddr is the gRPC listener's address once started (useful with :0).
func (s *Server) GRPCAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpcLis == nil {
		return nil
	}
	return s.grpcLis.Addr()
}

// HTTPAddr is the HTTP listener's address once started; nil when off.
func (s *Server) HTTPAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.httpLis == nil {
		return nil
	}
	return s.httpLis.Addr()
}

// Store is the open store, for in-process callers (the demo); nil before
// Start.
func (s *Server) Store() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store
}

// Start binds the HTTP listener (so /healthz answers at once), opens and
// recovers the store, binds the gRPC listener and serves both in the
// background. ctx bounds the start only.
func (s *Server) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("coordinator: already started")
	}
	s.started = true
	defer func() {
		if err != nil {
			s.closeLocked(context.Background()) //nolint:errcheck // the start error says more
		}
	}()
	if s.cfg.HTTPListen != "off" {
		s.httpLis, err = net.Listen("tcp", s.cfg.HTTPListen)
		if err != nil {
			return fmt.Errorf("coordinator: http listen: %w", err)
		}
		s.http = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			if err := s.http.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error().Err(err).Msg("http server stopped")
			}
		}()
	}

	var onCommit func(int, time.Duration)
	if s.opts.Metrics != nil {
		onCommit = s.opts.Metrics.StoreCommit
	}
	s.store, err = store.Open(ctx, store.Options{
		Dir:        s.cfg.DataDir,
		URL:        s.cfg.StoreURL,
		MaxBatch:   s.cfg.Batch.MaxResults,
		BatchDelay: s.cfg.Batch.Delay,
		Writers:    s.cfg.Batch.Writers,
		Logger:     s.log,
		Now:        s.now,
		OnCommit:   onCommit,
		Feed:       &remedFeedRead,
	})
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	// Bound (not served) before the recovery: the address is what this
	// coordinator's nodes are owned under.
	s.grpcLis, err = net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("coordinator: grpc listen: %w", err)
	}
	s.routeAddr = s.grpcLis.Addr().String()
	if s.cfg.HA.Advertise != "" {
		s.routeAddr = s.cfg.HA.Advertise
	}
	if err := s.recover(ctx); err != nil {
		return fmt.Errorf("coordinator: recover: %w", err)
	}
	if s.camp, err = startCampaigns(ctx, s, s.store); err != nil {
		return fmt.Errorf("coordinator: campaigns: %w", err)
	}

	s.grpc = grpc.NewServer(s.grpcOptions()...)
	pb.RegisterAgentServiceServer(s.grpc, &agentService{s: s})
	pb.RegisterOperatorServiceServer(s.grpc, &operatorService{s: s})
	pb.RegisterCampaignServiceServer(s.grpc, s.camp)
	pb.RegisterRemediationServiceServer(s.grpc, &remediationService{c: s.camp})
	pb.RegisterRoutingServiceServer(s.grpc, &routingService{s: s})
	// Lead (or join the election) once the address others name is bound.
	if err := s.camp.begin(ctx, s.grpcLis.Addr().String()); err != nil {
		return fmt.Errorf("coordinator: campaigns: %w", err)
	}
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		if err := s.grpc.Serve(s.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error().Err(err).Msg("grpc server stopped")
		}
	}()

	if err := s.startGossip(); err != nil {
		return fmt.Errorf("coordinator: gossip: %w", err)
	}
	if err := s.startConsole(); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}

	s.startedAt = s.now()
	s.live = newLiveness(s.cfg.HeartbeatInterval, s.startedAt)
	bgctx, cancel := context.WithCancel(context.Background())
	s.bgCancel = cancel
	s.bg.Add(3)
	go s.sweeper(bgctx)
	go s.watchPauses(bgctx)
	go s.retention(bgctx)

	s.ready.Store(true)
	ev := s.log.Info().Str("grpc", s.grpcLis.Addr().String()).Str("data_dir", s.cfg.DataDir).Str("store", s.store.Where()).
		Str("protocol", ProtocolVersion)
	if s.httpLis != nil {
		ev = ev.Str("http", s.httpLis.Addr().String())
	}
	if s.console != nil {
		ev = ev.Str("console", s.console.URL())
	}
	ev.Msg("coordinator serving")
	if s.cfg.Insecure {
		authz.WarnInsecure(s.log, s.grpcLis.Addr().String())
	}
	return nil
}

func (s *Server) grpcOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.opts.UnaryInterceptors...),
		grpc.ChainStreamInterceptor(s.opts.StreamInterceptors...),
		// Agents keep their stream open; let them ping it every 10s.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.MaxRecvMsgSize(16 << 20),
		// An idle agent stream's write buffer goes back to a pool after
		// each flush: gRPC shares write buffers by default (the
		// SharedWriteBuffer option is deprecated for that reason).
	}
	if s.opts.Credentials != nil {
		opts = append(opts, grpc.Creds(s.opts.Credentials))
	}
	return append(opts, s.opts.GRPCOptions...)
}

// recover brings the live view back from the store: no stream is open
// after a restart, so every node is marked disconnected, keeping its state
// until the startup grace says whether its agent came back.
//
// With several coordinators (ha:) only the nodes this address held (a
// previous process of this coordinator) are marked: the others' streams
// are theirs.
func (s *Server) recover(ctx context.Context) error {
	mine := ""
	if s.cfg.HA.Enabled {
		mine = s.routeAddr
	}
	n, err := s.store.MarkDisconnected(ctx, mine)
	if err != nil {
		return err
	}
	nodes, err := s.store.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, node := range nodes {
		e := s.reg.entry(node.Name)
		e.mu.Lock()
		e.load(node)
		e.mu.Unlock()
	}
	s.log.Info().Int("nodes", len(nodes)).Int("were_connected", n).Msg("store recovered")
	return nil
}

// Serve starts the server and runs it until ctx is done, then stops it
// gracefully.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return s.Stop(stopCtx)
}

// Stop ends every agent stream (agents reconnect elsewhere or later),
// lets unary calls finish until ctx is done, commits queued results and
// closes the store.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.stopped {
		return nil
	}
	s.stopped = true
	s.ready.Store(false)
	close(s.stopping)
	s.log.Info().Msg("coordinator stopping")
	return s.closeLocked(ctx)
}

// closeLocked releases whatever Start opened; s.mu is held.
func (s *Server) closeLocked(ctx context.Context) error {
	if s.bgCancel != nil {
		s.bgCancel()
		s.bg.Wait()
	}
	if s.grpc != nil {
		for _, sess := range s.reg.sessions() {
			sess.end(errShutdown)
		}
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
	} else if s.grpcLis != nil {
		_ = s.grpcLis.Close() // never served: nothing was accepted on it
	}
	var errs []error
	// The console reads the store and the campaigns: it stops first.
	if s.console != nil {
		if err := s.console.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("console shutdown: %w", err))
		}
	}
	if s.http != nil {
		if err := s.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
			_ = s.http.Close() // the shutdown error is already kept
		}
	} else if s.httpLis != nil {
		_ = s.httpLis.Close() // never served: nothing was accepted on it
	}
	s.serving.Wait()
	s.routes.close()
	// Gossip events write node states: the pool stops before the store.
	s.stopGossip()
	// Campaigns stop after the API (no handler is left using them) and
	// before the store their database handle belongs to.
	if s.camp != nil {
		if err := s.camp.stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop campaigns: %w", err))
		}
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	return errors.Join(errs...)
}

// sweeper runs once per heartbeat interval: it sends heartbeats, closes
// streams silent for three intervals, records last-seen times in one
// transaction, and after the startup grace marks nodes whose agents did
// not come back unreachable.
func (s *Server) sweeper(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweep(ctx, s.now())
	}
}

// sweep is one round of the sweeper at now.
func (s *Server) sweep(ctx context.Context, now time.Time) {
	iv := s.cfg.HeartbeatInterval
	// The sweep is a wake-up too: it may come first after a pause.
	s.noteWake(now)
	seen := make(map[string]time.Time)
	hb := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_Heartbeat{Heartbeat: &pb.Heartbeat{UnixMs: now.UnixMilli()}}}
	for _, sess := range s.reg.sessions() {
		last := sess.lastRecv()
		if silent := s.live.silence(last, now); silent > 3*iv {
			sess.end(&silenceError{silent: silent, interval: iv})
			continue
		}
		sess.trySend(hb) // a full queue is busy anyway: the heartbeat can wait
		if sess.touched.Swap(last.UnixNano()) != last.UnixNano() {
			seen[sess.node] = last
		}
	}
	if err := s.store.TouchNodes(ctx, seen); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("record last seen")
	}
	s.recordActivities(ctx)
	if !s.graceDone && now.Sub(s.startedAt) >= 3*iv {
		s.graceDone = true
		s.markAbsent(ctx, now)
	}
}

// markAbsent marks nodes whose agents did not reconnect after a restart.
func (s *Server) markAbsent(ctx context.Context, now time.Time) {
	// With several coordinators, a node whose stream another one holds
	// is not absent.
	elsewhere := map[string]bool{}
	if s.cfg.HA.Enabled {
		nodes, err := s.store.Nodes(ctx)
		if err != nil {
			s.log.Warn().Err(err).Msg("nodes not back after the start not marked: the store cannot say which are on other coordinators")
			s.graceDone = false // try again at the next sweep
			return
		}
		for _, n := range nodes {
			if n.Connected && n.Owner != "" && n.Owner != s.holder {
				elsewhere[n.Name] = true
			}
		}
	}
	for _, e := range s.reg.all() {
		if elsewhere[e.name] {
			continue
		}
		e.mu.Lock()
		// A node that left cleanly stays left: its agent was stopped.
		if e.sess == nil && e.state != StateUnreachable && e.state != StateLeft && !campaignOwned(e.state) && e.state != "" {
			reason := fmt.Sprintf("agent did not reconnect within %s of coordinator start", 3*s.cfg.HeartbeatInterval)
			s.setState(ctx, e, StateUnreachable, reason, "", nil, now)
		}
		if e.sess == nil && e.state != "" {
			s.conditions().notReporting(e, fmt.Sprintf("no agent connected within %s of coordinator start", 3*s.cfg.HeartbeatInterval))
		}
		e.mu.Unlock()
	}
}

// retentionEvery is how often raw results past retention are deleted.
const retentionEvery = time.Hour

func (s *Server) retention(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(retentionEvery)
	defer t.Stop()
	for {
		cut := s.now().AddDate(0, 0, -s.cfg.RetentionDays)
		st, err := s.store.Prune(ctx, cut)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn().Err(err).Msg("retention")
		case st.Results > 0:
			s.log.Info().Int("results", st.Results).Int("check_results", st.CheckResults).
				Time("before", cut).Msg("retention removed raw results")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setState records a node's state when it or its reason changed; e.mu is
// held by the caller. cause, when set, words the event. It returns false
// only when a lost stream was not recorded because the node's stream is
// another coordinator's now.
func (s *Server) setState(ctx context.Context, e *nodeEntry, state, reason, cause string, connected *bool, now time.Time) bool {
	if state == e.state && reason == e.reason && connected == nil {
		return true
	}
	prev := e.state
	owner := ""
	if connected != nil && !*connected {
		owner = s.holder // a lost stream is recorded only while the node is still ours
	}
	changed, err := s.store.SetNodeState(ctx, store.StateChange{
		Node: e.name, State: state, Reason: reason, Actor: "coordinator", At: now, Connected: connected, Cause: cause, Owner: owner,
	})
	if errors.Is(err, store.ErrNotOwner) {
		s.log.Info().Str("node", e.name).Err(err).Msg("stream ended here after the node moved to another coordinator")
		return false
	}
	if err != nil {
		s.log.Error().Err(err).Str("node", e.name).Str("state", state).Msg("record node state")
		return true
	}
	e.state, e.reason = state, reason
	if changed {
		s.log.Info().Str("node", e.name).Str("from", prev).Str("to", state).Str("reason", reason).Msg("node state changed")
	}
	return true
}

// Stats is a snapshot of the coordinator's counters, for /metrics.
type Stats struct {
	Version         string // the coordinator's build version (Options.Version)
	ConnectedAgents int
	NodesByState    map[string]int
	// Nodes is every known node with its state, by name.
	Nodes            []NodeState
	ResultsAcked     uint64 // stored for the first time
	ResultsDuplicate uint64 // answered with the original ack
	ResultsRefused   uint64 // never to be stored
	ActiveWork       int    // RunCheck calls in progress
	// WorkNodes and WorkNodesDone count the nodes of the RunCheck calls in
	// progress, and those of them with an outcome.
	WorkNodes, WorkNodesDone int
	Store                    store.Stats
	// GossipMembers counts the gossip pool's members by state (alive,
	// dead, left); nil when gossip is off.
	GossipMembers map[string]int
	// RefusalsSuppressed counts refusals past their identity's bound (not
	// logged, no event), by reason; TLSHandshakeFailures failed TLS
	// handshakes by reason (pki.HandshakeReason).
	RefusalsSuppressed   map[string]uint64
	TLSHandshakeFailures map[string]uint64
}

// NodeState is one node's state in Stats.
type NodeState struct{ Node, State string }

// Stats returns the current counters.
func (s *Server) Stats() Stats {
	entries := s.reg.all()
	st := Stats{Version: s.opts.Version, NodesByState: make(map[string]int), Nodes: make([]NodeState, 0, len(entries))}
	for _, e := range entries {
		e.mu.Lock()
		if e.sess != nil {
			st.ConnectedAgents++
		}
		if e.state != "" {
			st.NodesByState[e.state]++
			st.Nodes = append(st.Nodes, NodeState{Node: e.name, State: e.state})
		}
		e.mu.Unlock()
	}
	st.ResultsAcked = s.acked.Load()
	st.ResultsDuplicate = s.duplicates.Load()
	st.ResultsRefused = s.refused.Load()
	st.ActiveWork, st.WorkNodes, st.WorkNodesDone = s.works.progress()
	st.RefusalsSuppressed = s.opts.Refusals.Suppressed()
	st.TLSHandshakeFailures = s.opts.Refusals.Handshakes()
	if db := s.Store(); db != nil {
		st.Store = db.Stats()
	}
	if pool := s.gossip.Load(); pool != nil {
		st.GossipMembers = map[string]int{}
		for _, m := range pool.Members() {
			st.GossipMembers[m.State.String()]++
		}
	}
	return st
}
