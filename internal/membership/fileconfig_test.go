package membership

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

func writeKeyring(t *testing.T, path string, mode os.FileMode, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	// WriteFile keeps the mode of an existing file and the umask applies.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

func TestFileConfigConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k16 := bytes.Repeat([]byte{7}, 16)
	good := filepath.Join(dir, "good.keyring")
	writeKeyring(t, good, 0o600, b64(k16)+"\n")
	open := filepath.Join(dir, "open.keyring")
	writeKeyring(t, open, 0o644, b64(k16)+"\n")
	garbage := filepath.Join(dir, "garbage.keyring")
	writeKeyring(t, garbage, 0o600, "not a key\n")
	meta := Meta{Role: RoleAgent, Labels: map[string]string{"rack": "r12"}}

	for _, tc := range []struct {
		name    string
		fc      FileConfig
		keyring [][]byte
		err     string // "" valid; else in the error, which wraps ErrInvalidConfig
		check   func(t *testing.T, c Config)
	}{
		{name: "ip takes the default port", fc: FileConfig{Bind: "10.0.0.5"}, check: func(t *testing.T, c Config) {
			if c.BindAddr != "10.0.0.5" || c.BindPort != DefaultPort || c.AdvertiseAddr != "" || c.AdvertisePort != 0 {
				t.Errorf("bind %s:%d advertise %s:%d", c.BindAddr, c.BindPort, c.AdvertiseAddr, c.AdvertisePort)
			}
		}},
		{name: "ip:port", fc: FileConfig{Bind: "127.0.0.1:0"}, check: func(t *testing.T, c Config) {
			if c.BindAddr != "127.0.0.1" || c.BindPort != 0 {
				t.Errorf("bind %s:%d", c.BindAddr, c.BindPort)
			}
		}},
		{name: "ipv6", fc: FileConfig{Bind: "[::1]:8000"}, check: func(t *testing.T, c Config) {
			if c.BindAddr != "::1" || c.BindPort != 8000 {
				t.Errorf("bind %s:%d", c.BindAddr, c.BindPort)
			}
		}},
		{name: "every field", fc: FileConfig{
			Bind: "0.0.0.0:7000", Advertise: "10.0.0.5:7100", Join: []string{"10.0.0.1:7946"}, ClusterLabel: "prod",
			KeyringFile: good, RejoinInterval: config.Duration(time.Minute), ProbeInterval: config.Duration(2 * time.Second), SuspicionMult: 5,
		}, check: func(t *testing.T, c Config) {
			if c.NodeName != "gpu-001" || c.Meta.Labels["rack"] != "r12" || c.BindAddr != "0.0.0.0" || c.BindPort != 7000 ||
				c.AdvertiseAddr != "10.0.0.5" || c.AdvertisePort != 7100 || len(c.Join) != 1 || c.ClusterLabel != "prod" ||
				c.RejoinInterval != time.Minute || c.ProbeInterval != 2*time.Second || c.SuspicionMult != 5 {
				t.Errorf("config %+v", c)
			}
			if len(c.Keyring) != 1 || !bytes.Equal(c.Keyring[0], k16) {
				t.Errorf("keyring not read from the file")
			}
		}},
		{name: "advertise ip without port", fc: FileConfig{Bind: "0.0.0.0", Advertise: "10.0.0.5"}, check: func(t *testing.T, c Config) {
			if c.AdvertiseAddr != "10.0.0.5" || c.AdvertisePort != 0 {
				t.Errorf("advertise %s:%d", c.AdvertiseAddr, c.AdvertisePort)
			}
		}},
		{name: "given keyring wins over the file", fc: FileConfig{Bind: "127.0.0.1", KeyringFile: garbage},
			keyring: [][]byte{bytes.Repeat([]byte{9}, 32)}, check: func(t *testing.T, c Config) {
				if len(c.Keyring) != 1 || len(c.Keyring[0]) != 32 {
					t.Errorf("keyring %d keys", len(c.Keyring))
				}
			}},
		{name: "off", fc: FileConfig{Join: []string{"10.0.0.1:7946"}}, err: "gossip.bind is not set"},
		{name: "0.0.0.0 needs advertise", fc: FileConfig{Bind: "0.0.0.0"}, err: "needs an explicit advertise address"},
		{name: ":: needs advertise", fc: FileConfig{Bind: "[::]:7946"}, err: "needs an explicit advertise address"},
		{name: "host name", fc: FileConfig{Bind: "gpu-001:7946"}, err: "not an IP address"},
		{name: "neither ip nor ip:port", fc: FileConfig{Bind: "gpu-001"}, err: "gossip.bind"},
		{name: "bad port", fc: FileConfig{Bind: "127.0.0.1:99999"}, err: "bad port"},
		{name: "bad advertise", fc: FileConfig{Bind: "0.0.0.0", Advertise: "10.0.0.5:x"}, err: "gossip.advertise"},
		{name: "unspecified advertise", fc: FileConfig{Bind: "0.0.0.0", Advertise: "0.0.0.0"}, err: "not a usable IP"},
		{name: "join without port", fc: FileConfig{Bind: "127.0.0.1", Join: []string{"10.0.0.1"}}, err: "join address"},
		{name: "keyring missing", fc: FileConfig{Bind: "127.0.0.1", KeyringFile: filepath.Join(dir, "none")}, err: "gossip.keyring_file"},
		{name: "keyring readable by others", fc: FileConfig{Bind: "127.0.0.1", KeyringFile: open}, err: "chmod 600"},
		{name: "keyring garbage", fc: FileConfig{Bind: "127.0.0.1", KeyringFile: garbage}, err: "not base64"},
		{name: "bad given key", fc: FileConfig{Bind: "127.0.0.1"}, keyring: [][]byte{[]byte("short")}, err: "keyring[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := tc.fc
			c, err := fc.Config("gpu-001", meta, tc.keyring)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				tc.check(t, c)
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want ErrInvalidConfig containing %q", err, tc.err)
			}
		})
	}
}

func TestFileConfigEnabledAndResolve(t *testing.T) {
	t.Parallel()
	var nilFC *FileConfig
	if nilFC.Enabled() || (&FileConfig{}).Enabled() || !(&FileConfig{Bind: "127.0.0.1"}).Enabled() {
		t.Error("Enabled: on exactly when bind is set")
	}
	nilFC.Resolve("/etc") // no panic
	fc := &FileConfig{KeyringFile: "keys/gossip.keyring"}
	fc.Resolve("/etc/fleetcheck")
	if fc.KeyringFile != "/etc/fleetcheck/keys/gossip.keyring" {
		t.Errorf("relative: %q", fc.KeyringFile)
	}
	fc.Resolve("/elsewhere")
	if fc.KeyringFile != "/etc/fleetcheck/keys/gossip.keyring" {
		t.Errorf("absolute path changed: %q", fc.KeyringFile)
	}
}

func TestParseKeyring(t *testing.T) {
	t.Parallel()
	k16, k24, k32 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 24), bytes.Repeat([]byte{3}, 32)
	for _, tc := range []struct {
		name string
		in   string
		want [][]byte
		err  string
	}{
		{name: "one key", in: b64(k32) + "\n", want: [][]byte{k32}},
		{name: "all sizes, primary first, no final newline", in: b64(k24) + "\n" + b64(k16) + "\n" + b64(k32), want: [][]byte{k24, k16, k32}},
		{name: "comments, blanks and spaces", in: "# rotated 2024-05-01\n\n   " + b64(k16) + "  \n\t# old one:\n" + b64(k32) + "\n",
			want: [][]byte{k16, k32}},
		{name: "bad base64", in: b64(k16) + "\nnot*base64!\n", err: "line 2: not base64"},
		{name: "wrong length", in: "# c\n" + b64([]byte("twelve bytes")) + "\n", err: "line 2: key is 12 bytes"},
		{name: "empty", in: "", err: "no key"},
		{name: "only comments", in: "# nothing\n\n", err: "no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKeyring([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d keys, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tc.want[i]) {
					t.Errorf("key %d differs", i)
				}
			}
		})
	}
}

func TestReadKeyringFileRefusesOpenModes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := b64(bytes.Repeat([]byte{1}, 16)) + "\n"
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		p := filepath.Join(dir, "k"+mode.String())
		writeKeyring(t, p, mode, k)
		if _, err := ReadKeyringFile(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		p := filepath.Join(dir, "ok"+mode.String())
		writeKeyring(t, p, mode, k)
		if keys, err := ReadKeyringFile(p); err != nil || len(keys) != 1 {
			t.Errorf("mode %04o: %d keys, %v", mode, len(keys), err)
		}
	}
	if _, err := ReadKeyringFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	writeKeyring(t, bad, 0o600, "xx\n")
	if _, err := ReadKeyringFile(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("a parse error names the file: %v", err)
	}
}

func TestWriteKeyringFileRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "gossip.keyring")
	keys := [][]byte{bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16), bytes.Repeat([]byte{3}, 24)}
	// Twice: the second write replaces the first.
	for _, want := range [][][]byte{keys, keys[1:]} {
		if err := WriteKeyringFile(p, want); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("mode %04o, want 0600", st.Mode().Perm())
		}
		got, err := ReadKeyringFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d keys, want %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("key %d differs", i)
			}
		}
	}
	// No temporary file is left behind.
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("dir holds %d entries, want only the keyring", len(ents))
	}
	if err := WriteKeyringFile(filepath.Join(dir, "no", "such", "dir"), keys); err == nil {
		t.Error("write into a missing dir succeeded")
	}
}

func TestLoadKeyringPicksNewer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	configured, saved := filepath.Join(dir, "configured"), filepath.Join(dir, "saved")
	kc, ks := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	writeKeyring(t, configured, 0o600, b64(kc)+"\n")
	touch := func(p string, at time.Time) {
		t.Helper()
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	load := func() ([]byte, string) {
		t.Helper()
		keys, from, err := LoadKeyring(configured, saved)
		if err != nil {
			t.Fatal(err)
		}
		return keys[0], from
	}

	if k, from := load(); from != configured || !bytes.Equal(k, kc) {
		t.Errorf("no saved file: got %s", from)
	}
	if err := WriteKeyringFile(saved, [][]byte{ks}); err != nil {
		t.Fatal(err)
	}
	touch(configured, now.Add(-time.Hour))
	touch(saved, now)
	if k, from := load(); from != saved || !bytes.Equal(k, ks) {
		t.Errorf("saved newer: got %s", from)
	}
	// An operator edits the configured file after the rotation.
	touch(configured, now.Add(time.Minute))
	if k, from := load(); from != configured || !bytes.Equal(k, kc) {
		t.Errorf("configured newer: got %s", from)
	}
	// No keyring configured: encryption off, whatever was saved.
	if keys, from, err := LoadKeyring("", saved); keys != nil || from != "" || err != nil {
		t.Errorf("nothing configured: %d keys from %q, %v", len(keys), from, err)
	}
	// The chosen file must still be private.
	touch(configured, now.Add(-time.Hour))
	if err := os.Chmod(saved, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadKeyring(configured, saved); err == nil {
		t.Error("a world-readable saved keyring was used")
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	a, b := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	if fa := Fingerprint(a); len(fa) != 16 || fa != Fingerprint(a) || fa == Fingerprint(b) {
		t.Errorf("fingerprints %s %s", fa, Fingerprint(b))
	}
	if strings.Contains(Fingerprint(a), b64(a)) {
		t.Error("fingerprint reveals the key")
	}
}

// FuzzParseKeyring: a keyring file is operator input read at start. Any
// bytes give keys of a valid AES length or an error, never a panic, and
// what parses survives FormatKeyring unchanged.
func FuzzParseKeyring(f *testing.F) {
	k16 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 16))
	k32 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	for _, seed := range []string{
		k32 + "\n", "# c\n\n" + k16 + "\n" + k32, k32 + "\r\n", "not base64\n", "", "#\n", "AAAA\n", k16 + " trailing",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := ParseKeyring(b)
		if err != nil {
			if keys != nil {
				t.Fatalf("error %v with %d keys", err, len(keys))
			}
			return
		}
		if len(keys) == 0 {
			t.Fatal("no error and no key")
		}
		for _, k := range keys {
			if n := len(k); n != 16 && n != 24 && n != 32 {
				t.Fatalf("key of %d bytes accepted", n)
			}
		}
		again, err := ParseKeyring(FormatKeyring(keys))
		if err != nil || len(again) != len(keys) {
			t.Fatalf("FormatKeyring round trip: %d keys, %v", len(again), err)
		}
		for i := range keys {
			if !bytes.Equal(again[i], keys[i]) {
				t.Fatalf("key %d changed in the round trip", i)
			}
		}
	})
}
