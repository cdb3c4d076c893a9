package agent

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// gossipConfigOn turns gossip on in cfg, loopback only, on a free port.
func gossipConfigOn(cfg *Config, keyringFile string) {
	cfg.Gossip = &membership.FileConfig{
		Bind:          "127.0.0.1:0",
		KeyringFile:   keyringFile,
		ProbeInterval: config.Duration(200 * time.Millisecond),
	}
}

// coordPool stands in for the coordinator's side of the gossip pool.
type coordPool struct {
	*membership.Pool
	mu   sync.Mutex
	left []membership.Member
}

func startCoordPool(t *testing.T) *coordPool {
	t.Helper()
	cp := &coordPool{}
	mc := membership.LoopbackConfig("coordinator")
	mc.Meta = membership.Meta{Role: membership.RoleCoordinator}
	mc.ProbeInterval = 200 * time.Millisecond
	mc.RejoinInterval = -1
	p, err := membership.New(mc, zerolog.Nop(), membership.EventFuncs{Left: func(m membership.Member) {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		cp.left = append(cp.left, m)
	}})
	if err != nil {
		t.Fatalf("coordinator pool: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	cp.Pool = p
	return cp
}

func (cp *coordPool) leftAs(name string, st membership.State) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, m := range cp.left {
		if m.Name == name && m.State == st {
			return true
		}
	}
	return false
}

func (c *fakeCoord) firstHello() *fleetcheckv1.Hello {
	var h *fleetcheckv1.Hello
	c.get(func(c *fakeCoord) {
		if len(c.hellos) > 0 {
			h = c.hellos[0]
		}
	})
	return h
}

func (c *fakeCoord) gossipKeyStatus(opID string) *fleetcheckv1.GossipKeyStatus {
	var out *fleetcheckv1.GossipKeyStatus
	c.get(func(c *fakeCoord) {
		for _, s := range c.gossipKeys {
			if s.GetOpId() == opID {
				out = s
			}
		}
	})
	return out
}

// keyOp sends one key operation and waits for its status.
func keyOp(t *testing.T, c *fakeCoord, id string, op fleetcheckv1.GossipKeyOp_Op, key []byte) *fleetcheckv1.GossipKeyStatus {
	t.Helper()
	c.send(t, &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_GossipKey{GossipKey: &fleetcheckv1.GossipKeyOp{
		OpId: id, Op: op, Key: key}}})
	var st *fleetcheckv1.GossipKeyStatus
	testwait.Until(t, 10*time.Second, "gossip key status "+id, func() bool {
		st = c.gossipKeyStatus(id)
		return st != nil
	})

	return st
}

func TestGossipJoinsCoordinatorAndLeavesOnStop(t *testing.T) {
	t.Parallel()
	cp := startCoordPool(t)
	tn := &testNet{}
	c := newFakeCoord()
	c.gossipAddr = cp.LocalMember().Addr
	tn.serve(t, c)
	cfg := testConfig(t)
	gossipConfigOn(cfg, "")
	ta := startAgent(t, cfg, &fakeHost{}, tn)

	testwait.Until(t, 10*time.Second, "hello", func() bool { return c.firstHello() != nil })
	addr := c.firstHello().GetGossipAddr()
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("hello gossip_addr = %q, want 127.0.0.1:PORT", addr)
	}

	// The agent joins the address the welcome announced.
	testwait.Until(t, 10*time.Second, "coordinator pool sees the agent alive", func() bool {
		m, ok := cp.Member("gpu-001")
		return ok && m.State == membership.StateAlive
	})

	m, _ := cp.Member("gpu-001")
	if m.Addr != addr || m.Meta.Role != membership.RoleAgent || m.Meta.Labels["sku"] != "h100-sxm-8" ||
		m.Meta.Labels["rack"] != "r12" || m.Meta.AgentVersion != "test" || m.Meta.ProtocolVersion != version.Protocol {
		t.Errorf("coordinator sees %+v", m)
	}
	testwait.Until(t, 10*time.Second, "gossip member metrics", func() bool {
		var n [3]int
		ta.metrics.read(func(m *recMetrics) { n = m.gossip })
		return n == [3]int{2, 0, 0}
	})

	// A clean stop is a leave, not a failure.
	ta.stop()
	testwait.Until(t, 10*time.Second, "coordinator pool sees the agent left", func() bool {
		return cp.leftAs("gpu-001", membership.StateLeft)
	})

	if cp.leftAs("gpu-001", membership.StateDead) {
		t.Error("the agent was reported dead before it left")
	}
}

func TestGossipKeyRotationAppliedAndSaved(t *testing.T) {
	t.Parallel()
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)
	configured := filepath.Join(t.TempDir(), "gossip.keyring")
	if err := membership.WriteKeyringFile(configured, [][]byte{k1}); err != nil {
		t.Fatal(err)
	}
	// Older than anything a rotation writes, whatever the clock granularity.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(configured, old, old); err != nil {
		t.Fatal(err)
	}
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := testConfig(t)
	gossipConfigOn(cfg, configured)
	ta := startAgent(t, cfg, &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	saved := filepath.Join(cfg.StateDir, gossipKeyringFile)
	savedKeys := func() [][]byte {
		t.Helper()
		st, err := os.Stat(saved)
		if err != nil {
			t.Fatalf("saved keyring: %v", err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("saved keyring mode %04o, want 0600", st.Mode().Perm())
		}
		keys, err := membership.ReadKeyringFile(saved)
		if err != nil {
			t.Fatalf("saved keyring: %v", err)
		}
		return keys
	}
	same := func(got, want [][]byte) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				return false
			}
		}
		return true
	}

	for _, step := range []struct {
		id   string
		op   fleetcheckv1.GossipKeyOp_Op
		key  []byte
		want [][]byte // saved keyring afterwards, primary first
	}{
		{"install", fleetcheckv1.GossipKeyOp_OP_INSTALL, k2, [][]byte{k1, k2}},
		{"use", fleetcheckv1.GossipKeyOp_OP_USE, k2, [][]byte{k2, k1}},
		{"remove", fleetcheckv1.GossipKeyOp_OP_REMOVE, k1, [][]byte{k2}},
	} {
		st := keyOp(t, c, step.id, step.op, step.key)
		if st.GetError() != "" || int(st.GetKeys()) != len(step.want) {
			t.Fatalf("%s: status %v, want no error and %d keys", step.id, st, len(step.want))
		}
		if got := savedKeys(); !same(got, step.want) {
			t.Fatalf("%s: saved keyring %d keys, not the rotated ones", step.id, len(got))
		}
	}
	// The primary key cannot go; nothing is saved then.
	if st := keyOp(t, c, "remove-primary", fleetcheckv1.GossipKeyOp_OP_REMOVE, k2); st.GetError() == "" || st.GetKeys() != 1 {
		t.Errorf("removing the primary key: %v", st)
	}
	if st := keyOp(t, c, "bad-key", fleetcheckv1.GossipKeyOp_OP_INSTALL, []byte("short")); st.GetError() == "" {
		t.Errorf("installing a 5-byte key: %v", st)
	}
	if got := savedKeys(); !same(got, [][]byte{k2}) {
		t.Errorf("a failed operation changed the saved keyring")
	}
	// Fingerprints only: the key itself is never logged.
	logs := ta.logs.String()
	if !strings.Contains(logs, membership.Fingerprint(k2)) {
		t.Error("key operations not logged with the key's fingerprint")
	}
	for _, k := range [][]byte{k1, k2} {
		if strings.Contains(logs, base64.StdEncoding.EncodeToString(k)) || strings.Contains(logs, hex.EncodeToString(k)) {
			t.Error("a key appears in the logs")
		}
	}

	// A restart keeps the rotated keyring: the saved file is the newer one.
	ta.stop()
	ta2 := startAgent(t, cfg, &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "reconnected", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = len(c.hellos) })
		return n >= 2
	})

	if ta2.gossip == nil || !same(ta2.gossip.pool.Keys(), [][]byte{k2}) {
		t.Errorf("restarted agent does not use the rotated keyring")
	}
}

func TestGossipOffRefusesKeyOps(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.gossipAddr = "127.0.0.1:7946" // announced, but this agent has no pool
	tn.serve(t, c)
	startAgent(t, testConfig(t), &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	if addr := c.firstHello().GetGossipAddr(); addr != "" {
		t.Errorf("hello gossip_addr = %q with gossip off", addr)
	}
	st := keyOp(t, c, "op-1", fleetcheckv1.GossipKeyOp_OP_INSTALL, bytes.Repeat([]byte{3}, 16))
	if st.GetError() != "gossip is off on this agent" || st.GetKeys() != 0 {
		t.Errorf("status %v", st)
	}
}

func TestGossipStartFailureLeavesAgentRunning(t *testing.T) {
	t.Parallel()
	// The gossip port is taken: the agent must still report.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := testConfig(t)
	gossipConfigOn(cfg, "")
	cfg.Gossip.Bind = busy.Addr().String()
	ta := startAgent(t, cfg, &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "a result stored", func() bool { return c.stored() >= 1 })
	if addr := c.firstHello().GetGossipAddr(); addr != "" {
		t.Errorf("hello gossip_addr = %q though gossip failed", addr)
	}
	if !strings.Contains(ta.logs.String(), "gossip off: cannot start the gossip pool") {
		t.Errorf("gossip failure not logged:\n%s", ta.logs.String())
	}
}

func TestGossipConfig(t *testing.T) {
	t.Parallel()
	const base = "coordinator: coordinator.example.net:7443\ninsecure: true\n"
	c, err := ParseConfig([]byte(base + "gossip:\n  bind: 127.0.0.1\n  join: [10.0.0.1:7946]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Gossip.Enabled() || c.Gossip.Join[0] != "10.0.0.1:7946" {
		t.Errorf("gossip block not read: %+v", c.Gossip)
	}
	if c, err := ParseConfig([]byte(base)); err != nil || c.Gossip.Enabled() {
		t.Errorf("gossip must be off by default: %v %v", c.Gossip, err)
	}
	for _, bad := range []string{
		"gossip:\n  bind: 0.0.0.0\n",
		"gossip:\n  bind: gpu-001:7946\n",
		"gossip:\n  bind: 127.0.0.1\n  join: [10.0.0.1]\n",
	} {
		if _, err := ParseConfig([]byte(base + bad)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "gossip") {
			t.Errorf("%q: error %v", bad, err)
		}
	}

	// keyring_file is relative to the config file and read at load.
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	yaml := base + "state_dir: state\ngossip:\n  bind: 127.0.0.1\n  keyring_file: keys/gossip.keyring\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(file); err == nil || !strings.Contains(err.Error(), "keyring_file") {
		t.Errorf("missing keyring file: %v", err)
	}
	keyring := filepath.Join(dir, "keys", "gossip.keyring")
	if err := os.MkdirAll(filepath.Dir(keyring), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := membership.WriteKeyringFile(keyring, [][]byte{bytes.Repeat([]byte{1}, 16)}); err != nil {
		t.Fatal(err)
	}
	c, err = LoadConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	if c.Gossip.KeyringFile != keyring {
		t.Errorf("keyring_file = %q, want %q", c.Gossip.KeyringFile, keyring)
	}
	if err := os.Chmod(keyring, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(file); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable keyring: %v", err)
	}
}
