package console

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// minTokenLen keeps guessable tokens out: 128 bits as hex or base64.
const minTokenLen = 22

// maxTokenFile bounds what is read: a token file is a short list.
const maxTokenFile = 1 << 20

// tokens maps the SHA-256 of each token to the operator it names. Lookups
// go by the hash, so no comparison runs over the secret itself.
type tokens struct {
	path string

	mu     sync.RWMutex
	byHash map[[32]byte]string
	stamp  os.FileInfo
}

// loadTokens reads the file at path; "" gives an empty set.
func loadTokens(path string) (*tokens, error) {
	t := &tokens{path: path, byHash: map[[32]byte]string{}}
	if path == "" {
		return t, nil
	}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// reload reads the file again; on error the previous tokens stay.
func (t *tokens) reload() error {
	if t.path == "" {
		return nil
	}
	fi, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("console token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("console token file %s: mode %04o lets others read it; chmod 600", t.path, fi.Mode().Perm())
	}
	if fi.Size() > maxTokenFile {
		return fmt.Errorf("console token file %s: %d bytes, at most %d", t.path, fi.Size(), maxTokenFile)
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("console token file: %w", err)
	}
	m, err := parseTokens(b)
	if err != nil {
		return fmt.Errorf("console token file %s: %w", t.path, err)
	}
	t.mu.Lock()
	t.byHash, t.stamp = m, fi
	t.mu.Unlock()
	return nil
}

// changed reports whether the file is no longer the one last read.
func (t *tokens) changed() bool {
	if t.path == "" {
		return false
	}
	fi, err := os.Stat(t.path)
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err != nil || t.stamp == nil {
		return err == nil
	}
	return !os.SameFile(fi, t.stamp) || fi.Size() != t.stamp.Size() || !fi.ModTime().Equal(t.stamp.ModTime())
}

// parseTokens reads "NAME TOKEN" lines; '#' starts a comment.
func parseTokens(b []byte) (map[[32]byte]string, error) {
	m := map[[32]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want NAME TOKEN", n)
		}
		if err := pki.ValidateName(f[0]); err != nil {
			return nil, fmt.Errorf("line %d: name: %w", n, err)
		}
		if len(f[1]) < minTokenLen {
			return nil, fmt.Errorf("line %d: token of %s is %d characters, at least %d", n, f[0], len(f[1]), minTokenLen)
		}
		h := sha256.Sum256([]byte(f[1]))
		if prev, dup := m[h]; dup {
			return nil, fmt.Errorf("line %d: %s has the same token as %s", n, f[0], prev)
		}
		m[h] = f[0]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

var errBadToken = errors.New("unknown token")

// lookup returns the operator a token names.
func (t *tokens) lookup(tok string) (string, error) {
	if tok == "" {
		return "", errBadToken
	}
	h := sha256.Sum256([]byte(tok))
	t.mu.RLock()
	defer t.mu.RUnlock()
	name, ok := t.byHash[h]
	if !ok {
		return "", errBadToken
	}
	return name, nil
}
