package bundle

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Writer writes a bundle as a directory or, when the path ends in .tar.gz
// or .tgz, as a packed archive with one top-level directory.
type Writer struct {
	dir    string // directory mode
	f      *os.File
	gz     *gzip.Writer
	tw     *tar.Writer
	prefix string
	dirs   map[string]bool
	now    time.Time
}

// Packed reports whether a bundle path names an archive.
func Packed(p string) bool { return strings.HasSuffix(p, ".tar.gz") || strings.HasSuffix(p, ".tgz") }

// Create starts a bundle at p. An existing directory must be empty; an
// existing archive is not overwritten.
func Create(p string, now time.Time) (*Writer, error) {
	w := &Writer{dirs: map[string]bool{}, now: now}
	if !Packed(p) {
		if entries, err := os.ReadDir(p); err == nil && len(entries) > 0 {
			return nil, fmt.Errorf("create bundle: %s exists and is not empty", p)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, fmt.Errorf("create bundle: %w", err)
		}
		w.dir = p
		return w, nil
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create bundle: %w", err)
	}
	w.f = f
	w.gz = gzip.NewWriter(f)
	w.tw = tar.NewWriter(w.gz)
	base := filepath.Base(p)
	base = strings.TrimSuffix(strings.TrimSuffix(base, ".tar.gz"), ".tgz")
	w.prefix = base
	return w, nil
}

// AddFile writes one file at a slash-separated path relative to the bundle root.
func (w *Writer) AddFile(name string, data []byte) error {
	name = path.Clean(strings.TrimPrefix(name, "/"))
	if !fs.ValidPath(name) || name == "." {
		return fmt.Errorf("bundle: bad path %q", name)
	}
	if w.dir != "" {
		full := filepath.Join(w.dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("bundle: %w", err)
		}
		return os.WriteFile(full, data, 0o644)
	}
	full := path.Join(w.prefix, name)
	if err := w.mkdirs(path.Dir(full)); err != nil {
		return err
	}
	hdr := &tar.Header{Name: full, Mode: 0o644, Size: int64(len(data)), ModTime: w.now, Typeflag: tar.TypeReg}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	_, err := w.tw.Write(data)
	return err
}

func (w *Writer) mkdirs(d string) error {
	if d == "." || d == "" || w.dirs[d] {
		return nil
	}
	if err := w.mkdirs(path.Dir(d)); err != nil {
		return err
	}
	w.dirs[d] = true
	return w.tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, ModTime: w.now, Typeflag: tar.TypeDir})
}

// WriteManifest writes manifest.json.
func (w *Writer) WriteManifest(m Manifest) error {
	m.Format = FormatVersion
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return w.AddFile(ManifestFile, append(data, '\n'))
}

// Close finishes the bundle.
func (w *Writer) Close() error {
	if w.tw == nil {
		return nil
	}
	if err := w.tw.Close(); err != nil {
		_ = w.f.Close() // the write error is the one to report
		return err
	}
	if err := w.gz.Close(); err != nil {
		_ = w.f.Close() // the write error is the one to report
		return err
	}
	return w.f.Close()
}
