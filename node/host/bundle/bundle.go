// Package bundle reads a support bundle (format version 1, docs/design.md): a
// directory, or the same packed as .tar.gz. A bundle is untrusted input:
// either kind has its paths, entry types and sizes checked against Limits
// when it is opened, and anything hostile is refused with ErrHostile.
// Memory stays bounded whatever the bundle holds: small files are held,
// large ones are read from the disk or the archive when asked, and the
// kernel log is handed to its parser as a stream (CaptureStream).
package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/safefs"
)

// FormatVersion is the bundle format this package reads and writes.
const FormatVersion = 1

// ManifestFile is the manifest's name at the bundle root.
const ManifestFile = "manifest.json"

// Manifest is manifest.json.
type Manifest struct {
	Format            int                                      `json:"format"`
	Hostname          string                                   `json:"hostname"`
	CollectedAt       string                                   `json:"collected_at"`
	FleetcheckVersion string                                   `json:"fleetcheck_version"`
	Sources           map[snapshot.Source]snapshot.SourceState `json:"sources"`
}

var (
	// ErrHostile marks a bundle refused for safety: path escapes, links,
	// devices, or sizes past the limits.
	ErrHostile = errors.New("hostile bundle")
	// ErrFormat marks a bundle that is not a readable bundle.
	ErrFormat = errors.New("not a fleetcheck bundle")
)

// Bundle is an opened bundle; it implements host.Host.
type Bundle struct {
	root     fs.FS
	manifest Manifest
	at       time.Time
}

var (
	_ host.Host     = (*Bundle)(nil)
	_ host.Streamer = (*Bundle)(nil)
)

// Open opens a bundle directory or .tar.gz file with DefaultLimits.
func Open(p string) (*Bundle, error) { return OpenWithLimits(p, DefaultLimits) }

// OpenWithLimits opens a bundle with explicit limits.
func OpenWithLimits(p string, lim Limits) (*Bundle, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("open bundle: %w", err)
	}
	if err := safefs.CheckInfo(p, st, math.MaxInt64); err != nil {
		return nil, fmt.Errorf("open bundle: %w", hostile(err))
	}
	if st.IsDir() {
		// Through os.Root (dirfs.go), not os.DirFS: a symlink in a directory bundle may not
		// lead out of it. A bundle from another machine is untrusted input,
		// and a link to /etc/shadow must not end up in a report.
		d, err := openDir(p, lim)
		if err != nil {
			return nil, fmt.Errorf("open bundle: %w", err)
		}
		return FromFS(d)
	}
	f, err := os.OpenFile(p, safefs.OpenFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("open bundle: %w", err)
	}
	if st, err = f.Stat(); err == nil {
		err = safefs.CheckInfo(p, st, math.MaxInt64)
	}
	if err != nil || st.IsDir() {
		_ = f.Close() // read-only; the open error is the one to report
		return nil, fmt.Errorf("open bundle: %s changed while it was opened: %w", p, hostile(err))
	}
	// f stays open while the bundle is used: its large files are streamed
	// from it (the os.File closes itself once unreachable).
	m, err := Unpack(f, st.Size(), lim)
	if err != nil {
		_ = f.Close() // read-only; the open error is the one to report
		return nil, fmt.Errorf("open bundle %s: %w", p, err)
	}
	if len(m.(*memFS).streamed) == 0 {
		_ = f.Close() // read in full: nothing left to lose
	}
	return FromFS(m)
}

// FromFS reads a bundle from a file tree whose root holds manifest.json (or
// one top-level directory that does).
func FromFS(fsys fs.FS) (*Bundle, error) {
	root := fsys
	if _, err := fs.Stat(fsys, ManifestFile); err != nil {
		// Accept one top-level directory, as `tar czf x.tar.gz dir/` makes.
		entries, rerr := fs.ReadDir(fsys, ".")
		if rerr == nil && len(entries) == 1 && entries[0].IsDir() {
			if sub, serr := fs.Sub(fsys, entries[0].Name()); serr == nil {
				if _, err2 := fs.Stat(sub, ManifestFile); err2 == nil {
					root = sub
				}
			}
		}
	}
	b := &Bundle{root: root}
	data, err := fs.ReadFile(root, ManifestFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Every file is optional, the manifest too: judge what is there.
		b.manifest = Manifest{Format: FormatVersion}
	case err != nil:
		return nil, fmt.Errorf("%w: read manifest: %v", ErrFormat, err)
	default:
		if err := json.Unmarshal(data, &b.manifest); err != nil {
			return nil, fmt.Errorf("%w: manifest.json: %v", ErrFormat, err)
		}
		if b.manifest.Format != FormatVersion {
			return nil, fmt.Errorf("%w: manifest format %d, this fleetcheck reads %d", ErrFormat, b.manifest.Format, FormatVersion)
		}
	}
	if b.manifest.CollectedAt != "" {
		t, err := time.Parse(time.RFC3339, b.manifest.CollectedAt)
		if err != nil {
			return nil, fmt.Errorf("%w: manifest collected_at %q: %v", ErrFormat, b.manifest.CollectedAt, err)
		}
		b.at = t
	}
	return b, nil
}

// Manifest returns the bundle's manifest.
func (b *Bundle) Manifest() Manifest { return b.manifest }

// Name is the hostname the bundle was collected on.
func (b *Bundle) Name() string {
	if b.manifest.Hostname == "" {
		return "unknown"
	}
	return b.manifest.Hostname
}

// Now is the collection time: a bundle's clock stopped when it was taken.
// Zero when the manifest does not say.
func (b *Bundle) Now() time.Time { return b.at }

// FS is the captured host tree under fs/.
func (b *Bundle) FS() fs.FS {
	sub, err := fs.Sub(b.root, "fs")
	if err != nil {
		return emptyFS{}
	}
	return sub
}

// Capture replays a captured command source. The manifest's record wins:
// a source recorded as failed or timed out is evidence, even without a file.
func (b *Bundle) Capture(_ context.Context, src snapshot.Source) host.Capture {
	data, err := fs.ReadFile(b.root, string(src))
	return b.capture(src, data, err)
}

// CaptureStream is Capture with the data as a stream, for the kernel log:
// a large dmesg.txt is parsed line by line, never held whole. The caller
// closes the stream, which is nil unless the capture's State is ok or the
// manifest recorded output with a failure.
func (b *Bundle) CaptureStream(_ context.Context, src snapshot.Source) (io.ReadCloser, host.Capture) {
	f, err := b.root.Open(string(src))
	if err == nil {
		if fi, serr := f.Stat(); serr == nil && fi.IsDir() {
			_ = f.Close() // read-only; the capture says what went wrong
			f, err = nil, &fs.PathError{Op: "read", Path: string(src), Err: errIsDir}
		}
	}
	c := b.capture(src, nil, err)
	if err != nil {
		return nil, c
	}
	if c.State == snapshot.StateAbsent {
		_ = f.Close() // read-only; the capture says what went wrong
		return nil, c
	}
	return f, c
}

func (b *Bundle) capture(src snapshot.Source, data []byte, err error) host.Capture {
	present := err == nil
	rec, recorded := b.manifest.Sources[src]
	if recorded && rec.State != "" && rec.State != snapshot.StateOK {
		if rec.State == snapshot.StateAbsent {
			return host.Absent(orDefault(rec.Error, string(src)+" not collected"))
		}
		return host.Capture{Data: data, State: rec.State, ExitCode: rec.ExitCode, Err: orDefault(rec.Error, string(rec.State))}
	}
	if !present {
		if errors.Is(err, fs.ErrNotExist) {
			return host.Absent(string(src) + " not in bundle")
		}
		return host.Capture{State: snapshot.StateFailed, Err: fmt.Sprintf("read %s: %v", src, err)}
	}
	c := host.OK(data)
	c.ExitCode = rec.ExitCode
	return c
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

type emptyFS struct{}

func (emptyFS) Open(name string) (fs.File, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

// safeName turns a tar entry name into a clean relative path, refusing
// absolute paths and any path that climbs out of the root.
func safeName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty entry name", ErrHostile)
	}
	if strings.Contains(name, "\\") || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: entry %q has a backslash or NUL", ErrHostile, name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: entry %q is an absolute path", ErrHostile, name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: entry %q escapes the bundle root", ErrHostile, name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return ".", nil
	}
	if !fs.ValidPath(clean) {
		return "", fmt.Errorf("%w: entry %q is not a valid path", ErrHostile, name)
	}
	return clean, nil
}
