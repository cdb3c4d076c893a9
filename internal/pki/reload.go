package pki

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// DefaultCheckInterval is how often a Reloader looks at its files when
// asked by a handshake: often enough that a replaced certificate is served
// within seconds, rarely enough that thousands of reconnecting agents do
// not turn into thousands of stats.
const DefaultCheckInterval = 10 * time.Second

// Files names the PEM files of one TLS identity: its certificate (with any
// intermediates after it), its private key, and the bundle of CA
// certificates it trusts for its peers.
type Files struct {
	CertFile string
	KeyFile  string
	CAFile   string
}

// ReloaderOptions tune NewReloader; the zero value is fine.
type ReloaderOptions struct {
	Logger zerolog.Logger
	// CheckInterval is the least time between two looks at the files from
	// a handshake (default DefaultCheckInterval); negative turns the
	// handshake-driven look off, leaving Check, Run and Reload.
	CheckInterval time.Duration
}

// Reloader holds a certificate, its key and a CA pool read from files,
// and reads them again when the files change. Handshakes read the current
// material; a failed reload keeps the previous material, so a half-copied
// file never takes a server down.
type Reloader struct {
	files    Files
	log      zerolog.Logger
	interval time.Duration

	cur       atomic.Pointer[material]
	lastCheck atomic.Int64 // unix nanoseconds of the last handshake-driven look
	mu        sync.Mutex   // one reload at a time
}

type material struct {
	cert   *tls.Certificate // Leaf set
	pool   *x509.CertPool
	cas    []string // SHA-256 fingerprints of the pool's certificates
	stamps [3]stamp // cert, key, CA file as they were when read
}

// stamp is what tells a changed file: an atomic rename gives a new file
// (not SameFile) even when size and time happen to match.
type stamp struct {
	info os.FileInfo
}

func (s stamp) same(o stamp) bool {
	if s.info == nil || o.info == nil {
		return false
	}
	return os.SameFile(s.info, o.info) && s.info.Size() == o.info.Size() && s.info.ModTime().Equal(o.info.ModTime())
}

// NewReloader reads the files once; it fails if they do not make a
// usable certificate, key and CA pool.
func NewReloader(files Files, opts ReloaderOptions) (*Reloader, error) {
	if files.CertFile == "" || files.KeyFile == "" || files.CAFile == "" {
		return nil, errors.New("tls: certificate, key and CA files are all required")
	}
	interval := opts.CheckInterval
	if interval == 0 {
		interval = DefaultCheckInterval
	}
	r := &Reloader{files: files, log: opts.Logger, interval: interval}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	r.lastCheck.Store(time.Now().UnixNano())
	return r, nil
}

// Files are the files the Reloader reads.
func (r *Reloader) Files() Files { return r.files }

// Certificate is the current certificate chain and key.
func (r *Reloader) Certificate() *tls.Certificate { return r.cur.Load().cert }

// Leaf is the current leaf certificate.
func (r *Reloader) Leaf() *x509.Certificate { return r.cur.Load().cert.Leaf }

// CAPool is the current pool of trusted CA certificates.
func (r *Reloader) CAPool() *x509.CertPool { return r.cur.Load().pool }

// Reload reads all three files now, whatever their stamps say. On error
// the previous material stays in use.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked()
}

// Check reloads when any file changed since it was last read, and says
// whether it did.
func (r *Reloader) Check() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps, err := r.stat()
	if err != nil {
		return false, err
	}
	if old := r.cur.Load(); old != nil && stamps[0].same(old.stamps[0]) &&
		stamps[1].same(old.stamps[1]) && stamps[2].same(old.stamps[2]) {
		return false, nil
	}
	if err := r.reloadLocked(); err != nil {
		return false, err
	}
	return true, nil
}

// Run checks the files every interval until ctx ends, logging reloads and
// failures. Handshakes also check (see CheckInterval); Run makes a
// replaced or broken file show up in the log even while no one connects.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.checkAndLog()
		}
	}
}

// maybeCheck is the handshake-driven look: at most once per interval, by
// whichever handshake gets there first; the others go on with what is
// loaded.
func (r *Reloader) maybeCheck() {
	if r.interval < 0 {
		return
	}
	now := time.Now().UnixNano()
	last := r.lastCheck.Load()
	if now-last < int64(r.interval) || !r.lastCheck.CompareAndSwap(last, now) {
		return
	}
	r.checkAndLog()
}

func (r *Reloader) checkAndLog() {
	if _, err := r.Check(); err != nil {
		r.log.Warn().Err(err).Str("cert_file", r.files.CertFile).
			Msg("tls files changed but could not be loaded; still using the previous certificate")
	}
}

func (r *Reloader) stat() ([3]stamp, error) {
	var s [3]stamp
	for i, p := range []string{r.files.CertFile, r.files.KeyFile, r.files.CAFile} {
		fi, err := os.Stat(p)
		if err != nil {
			return s, fmt.Errorf("tls: %w", err)
		}
		s[i] = stamp{info: fi}
	}
	return s, nil
}

func (r *Reloader) reloadLocked() error {
	// Stamps are taken before reading: a file replaced while it is read
	// then looks changed at the next check and is read again.
	stamps, err := r.stat()
	if err != nil {
		return err
	}
	certPEM, err := os.ReadFile(r.files.CertFile)
	if err != nil {
		return fmt.Errorf("tls: read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.files.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: read key: %w", err)
	}
	caPEM, err := os.ReadFile(r.files.CAFile)
	if err != nil {
		return fmt.Errorf("tls: read CA bundle: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("tls: %s and %s: %w", r.files.CertFile, r.files.KeyFile, err)
	}
	if cert.Leaf == nil { // X509KeyPair fills it unless GODEBUG says otherwise
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("tls: %s: %w", r.files.CertFile, err)
		}
	}
	cas, err := ParseCertsPEM(caPEM)
	if err != nil {
		return fmt.Errorf("tls: CA bundle %s: %w", r.files.CAFile, err)
	}
	pool := x509.NewCertPool()
	fps := make([]string, 0, len(cas))
	for _, c := range cas {
		pool.AddCert(c)
		fps = append(fps, Fingerprint(c))
	}
	old := r.cur.Swap(&material{cert: &cert, pool: pool, cas: fps, stamps: stamps})
	if old != nil {
		// Who is trusted changed: say which CAs, so an unexpected bundle
		// shows in the log by the certificates it added.
		if added, removed := diff(old.cas, fps), diff(fps, old.cas); len(added)+len(removed) > 0 {
			r.log.Info().Str("ca_file", r.files.CAFile).Strs("added_sha256", added).Strs("removed_sha256", removed).
				Int("cas", len(fps)).Msg("tls ca bundle changed")
		}
	}

	leaf := cert.Leaf
	ev := r.log.Info()
	if old != nil && old.cert.Leaf.Equal(leaf) {
		ev = r.log.Debug()
	}
	if id, err := ParseIdentity(leaf); err == nil {
		ev = ev.Str("identity", id.String())
	}
	ev.Str("cert_file", r.files.CertFile).Str("serial", leaf.SerialNumber.Text(16)).
		Time("not_after", leaf.NotAfter).Int("cas", len(cas)).Msg("tls certificate loaded")
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		r.log.Warn().Str("cert_file", r.files.CertFile).Time("not_before", leaf.NotBefore).
			Time("not_after", leaf.NotAfter).Msg("tls certificate is not valid now; peers will refuse it")
	}
	return nil
}

// Fingerprint is a certificate's SHA-256 fingerprint, lowercase hex, as
// `openssl x509 -fingerprint -sha256` shows it without the colons.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// diff is what b has and a does not.
func diff(a, b []string) []string {
	out := []string{}
	for _, x := range b {
		if !slices.Contains(a, x) && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
