package membership

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLoopbackConfigBindsAndAdvertisesLoopback(t *testing.T) {
	t.Parallel()
	c := LoopbackConfig("n1")
	if c.BindAddr != "127.0.0.1" || c.AdvertiseAddr != "127.0.0.1" {
		t.Fatalf("bind %q advertise %q, want 127.0.0.1 for both", c.BindAddr, c.AdvertiseAddr)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("LoopbackConfig does not validate: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	key16 := []byte("0123456789abcdef")
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // substring of the error; empty means valid
	}{
		{"loopback", func(*Config) {}, ""},
		{"no name", func(c *Config) { c.NodeName = "" }, "node name"},
		{"no bind address", func(c *Config) { c.BindAddr = "" }, "bind address is required"},
		{"bind host name", func(c *Config) { c.BindAddr = "localhost" }, "not an IP"},
		{"unspecified bind, no advertise", func(c *Config) { c.BindAddr, c.AdvertiseAddr = "0.0.0.0", "" }, "explicit advertise"},
		{"unspecified bind, explicit advertise", func(c *Config) { c.BindAddr = "0.0.0.0" }, ""},
		{"unspecified advertise", func(c *Config) { c.AdvertiseAddr = "0.0.0.0" }, "advertise address"},
		{"bad port", func(c *Config) { c.BindPort = 70000 }, "ports"},
		{"join without port", func(c *Config) { c.Join = []string{"127.0.0.1"} }, "join address"},
		{"key 16", func(c *Config) { c.Keyring = [][]byte{key16} }, ""},
		{"key 32", func(c *Config) { c.Keyring = [][]byte{[]byte(strings.Repeat("k", 32))} }, ""},
		{"key 10", func(c *Config) { c.Keyring = [][]byte{key16, []byte("short key!")} }, "keyring[1]"},
		{"label too long", func(c *Config) { c.ClusterLabel = strings.Repeat("l", 256) }, "cluster label"},
		{"probe timeout too long", func(c *Config) { c.ProbeInterval, c.ProbeTimeout = time.Second, time.Second }, "probe timeout"},
		{"negative", func(c *Config) { c.TCPTimeout = -time.Second }, "negative"},
		{"no role", func(c *Config) { c.Meta.Role = "" }, "role"},
		{"meta too large", func(c *Config) { c.Meta.Labels = map[string]string{"x": strings.Repeat("y", 600)} }, "too large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := LoopbackConfig("n1")
			tc.modify(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestMetaTooLargeIsReportedByNew(t *testing.T) {
	t.Parallel()
	c := LoopbackConfig("n1")
	c.Meta.Labels = map[string]string{"x": strings.Repeat("y", 600)}
	_, err := New(c, testLogger(), nil)
	if !errors.Is(err, ErrMetaTooLarge) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New() = %v, want ErrInvalidConfig wrapping ErrMetaTooLarge", err)
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	c := Config{BindAddr: "127.0.0.1"}.withDefaults()
	if c.AdvertiseAddr != "127.0.0.1" {
		t.Errorf("advertise = %q, want the bind address", c.AdvertiseAddr)
	}
	if c.ProbeInterval != DefaultProbeInterval || c.SuspicionMult != DefaultSuspicionMult || c.RejoinInterval != DefaultRejoinInterval {
		t.Errorf("defaults not applied: %+v", c)
	}
	fast := Config{BindAddr: "127.0.0.1", ProbeInterval: 100 * time.Millisecond}.withDefaults()
	if fast.ProbeTimeout >= fast.ProbeInterval {
		t.Errorf("probe timeout %s not below interval %s", fast.ProbeTimeout, fast.ProbeInterval)
	}
	off := Config{BindAddr: "127.0.0.1", RejoinInterval: -1}.withDefaults()
	if off.RejoinInterval >= 0 {
		t.Errorf("negative rejoin interval should stay negative (disabled), got %s", off.RejoinInterval)
	}
}
