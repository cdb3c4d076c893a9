package membership

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

// FileConfig is the `gossip:` block of the agent's and the coordinator's
// configuration files (docs/agent.md, docs/config.md). Gossip is off unless
// Bind is set.
type FileConfig struct {
	// Bind is "IP" or "IP:PORT" to listen on, UDP and TCP; port default
	// DefaultPort. There is no default address: set the node's data-plane
	// address (127.0.0.1 in tests and the demo).
	Bind string `yaml:"bind"`
	// Advertise is "IP" or "IP:PORT" that peers reach this member at;
	// default the bind address. Required when binding 0.0.0.0 or ::.
	Advertise string `yaml:"advertise"`
	// Join lists seed addresses ("IP:PORT"), typically the coordinator's.
	// An agent with none joins the address its coordinator announces.
	Join []string `yaml:"join"`
	// Name is the member's name; default the agent's node name, or
	// "coordinator" for the coordinator.
	Name string `yaml:"name"`
	// ClusterLabel keeps pools apart that share a network.
	ClusterLabel string `yaml:"cluster_label"`
	// KeyringFile turns encryption on: base64 AES keys (16, 24 or 32
	// bytes), one per line, the first one primary. '#' starts a comment.
	KeyringFile string `yaml:"keyring_file"`
	// RejoinInterval: see Config.RejoinInterval (default 20s).
	RejoinInterval config.Duration `yaml:"rejoin_interval"`
	// ProbeInterval: memberlist's failure-detector probe interval (default 1s).
	ProbeInterval config.Duration `yaml:"probe_interval"`
	// SuspicionMult: memberlist's suspicion multiplier (default 4).
	SuspicionMult int `yaml:"suspicion_mult"`
}

// Enabled says whether the block turns gossip on.
func (f *FileConfig) Enabled() bool { return f != nil && f.Bind != "" }

// Resolve makes the keyring path absolute against the config file's dir.
func (f *FileConfig) Resolve(dir string) {
	if f != nil && f.KeyringFile != "" && !filepath.IsAbs(f.KeyringFile) {
		f.KeyringFile = filepath.Join(dir, f.KeyringFile)
	}
}

// Config builds the Pool configuration for member name with meta. keyring
// is the keyring to start with (see LoadKeyring); nil means the file's.
func (f *FileConfig) Config(name string, meta Meta, keyring [][]byte) (Config, error) {
	if !f.Enabled() {
		return Config{}, fmt.Errorf("%w: gossip.bind is not set", ErrInvalidConfig)
	}
	if err := errors.Join(
		config.R(config.Duration(time.Second), config.Duration(time.Hour)).CheckOrZero("gossip.rejoin_interval", f.RejoinInterval),
		config.R(config.Duration(100*time.Millisecond), config.Duration(time.Minute)).CheckOrZero("gossip.probe_interval", f.ProbeInterval),
		config.R(1, 64).CheckOrZero("gossip.suspicion_mult", f.SuspicionMult),
	); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c := Config{NodeName: name, Meta: meta, Join: append([]string(nil), f.Join...), ClusterLabel: f.ClusterLabel,
		RejoinInterval: time.Duration(f.RejoinInterval), ProbeInterval: time.Duration(f.ProbeInterval), SuspicionMult: f.SuspicionMult}
	var err error
	if c.BindAddr, c.BindPort, err = hostPort(f.Bind, DefaultPort); err != nil {
		return Config{}, fmt.Errorf("%w: gossip.bind: %w", ErrInvalidConfig, err)
	}
	if f.Advertise != "" {
		if c.AdvertiseAddr, c.AdvertisePort, err = hostPort(f.Advertise, 0); err != nil {
			return Config{}, fmt.Errorf("%w: gossip.advertise: %w", ErrInvalidConfig, err)
		}
	}
	if keyring == nil && f.KeyringFile != "" {
		if keyring, err = ReadKeyringFile(f.KeyringFile); err != nil {
			return Config{}, fmt.Errorf("%w: gossip.keyring_file: %w", ErrInvalidConfig, err)
		}
	}
	c.Keyring = keyring
	return c, c.Validate()
}

// hostPort reads "IP" or "IP:PORT".
func hostPort(s string, defPort int) (string, int, error) {
	if ip := net.ParseIP(s); ip != nil {
		return s, defPort, nil
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%q is neither IP nor IP:PORT", s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	return h, port, nil
}

// ParseKeyring reads the keyring file format: base64 keys, one per line,
// primary first; blank lines and '#' comments are skipped.
func ParseKeyring(b []byte) ([][]byte, error) {
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: not base64: %w", line, err)
		}
		switch len(k) {
		case 16, 24, 32:
		default:
			return nil, fmt.Errorf("line %d: key is %d bytes, want 16, 24 or 32", line, len(k))
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in keyring")
	}
	return keys, nil
}

// ReadKeyringFile reads a keyring file. It refuses a file others can read:
// the keys are secrets.
func ReadKeyringFile(path string) ([][]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: mode %04o lets others read the gossip keys; chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	keys, err := ParseKeyring(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// FormatKeyring renders keys in the keyring file format.
func FormatKeyring(keys [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString("# fleetcheck gossip keyring: base64 keys, primary first\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// WriteKeyringFile writes keys atomically with mode 0600, so that a member
// restarted after a rotation starts with the rotated keyring.
func WriteKeyringFile(path string, keys [][]byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".keyring-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone already after the rename; else a leftover temp file
	if _, err := tmp.Write(FormatKeyring(keys)); err != nil {
		_ = tmp.Close() // the write error is the one to report
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close() // the sync error is the one to report
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// LoadKeyring picks the keyring a member starts with: the newer of the
// configured file and the one a rotation saved (saved, in the state dir).
// A rotation writes saved; an operator who edits the configured file
// afterwards makes it the newer one again.
func LoadKeyring(configured, saved string) ([][]byte, string, error) {
	if configured == "" {
		return nil, "", nil
	}
	use := configured
	if cs, err := os.Stat(configured); err == nil {
		if ss, err := os.Stat(saved); err == nil && saved != "" && ss.ModTime().After(cs.ModTime()) {
			use = saved
		}
	}
	keys, err := ReadKeyringFile(use)
	return keys, use, err
}

// Fingerprints names each key, in order.
func Fingerprints(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = Fingerprint(k)
	}
	return out
}

// Fingerprint names a key without revealing it: the first 8 bytes of its
// SHA-256, hex.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}
