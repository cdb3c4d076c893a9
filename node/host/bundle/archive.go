package bundle

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// archive is a packed bundle that can be read again: the first pass
// (Unpack) checks every entry and holds the small files; a large file is
// read by a later pass that decompresses up to it and streams it, so no
// large file is ever held and nothing is written to disk.
type archive struct {
	r    io.ReaderAt
	size int64
	lim  Limits
}

// errStop ends a pass early without an error.
var errStop = errors.New("stop")

// pass decompresses the archive from the start and calls fn for each
// entry with its ordinal. The decompressed stream is bounded: a gzip bomb
// fails the pass as soon as it passes the limit.
func (a *archive) pass(fn func(i int, hdr *tar.Header, tr *tar.Reader) error) error {
	gz, err := gzip.NewReader(io.NewSectionReader(a.r, 0, a.size))
	if err != nil {
		return fmt.Errorf("%w: not gzip: %v", ErrFormat, err)
	}
	defer func() { _ = gz.Close() }() // a reader: nothing to lose on close
	tr := tar.NewReader(&boundedReader{r: gz, left: a.lim.decompressedLimit()})
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if errors.Is(err, errBomb) {
			return a.bomb()
		}
		if err != nil {
			return fmt.Errorf("%w: read tar: %v", ErrFormat, err)
		}
		if err := fn(i, hdr, tr); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			if errors.Is(err, errBomb) {
				return a.bomb()
			}
			return err
		}
	}
}

func (a *archive) bomb() error {
	return fmt.Errorf("%w: decompresses past %d bytes (a gzip bomb?)", ErrHostile, a.lim.decompressedLimit())
}

var errBomb = errors.New("decompressed past the limit")

// boundedReader fails once more than left bytes have come through.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			return 0, errBomb
		}
		return b.r.Read(p)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// Unpack reads a .tar.gz bundle of size bytes from r, refusing entries
// that would escape the root, links, devices, and anything past the
// limits. Small files are held in memory; larger ones stay in the archive
// and are streamed from r, which must stay readable, when they are opened.
func Unpack(r io.ReaderAt, size int64, lim Limits) (fs.FS, error) {
	lim = lim.withDefaults()
	a := &archive{r: r, size: size, lim: lim}
	m := newMemFS()
	m.arc = a
	var total, names int64
	budget := holdBudget{lim: lim}
	err := a.pass(func(i int, hdr *tar.Header, tr *tar.Reader) error {
		// Directories a path implies count as entries too.
		if i+1 > lim.MaxEntries || len(m.dirs)-1+len(m.files)+len(m.streamed) > lim.MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrHostile, lim.MaxEntries)
		}
		if err := checkName(hdr.Name, &names); err != nil {
			return err
		}
		name, err := safeName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if m.isFile(name) {
					return fmt.Errorf("%w: %s is both a file and a directory", ErrHostile, hdr.Name)
				}
				m.addDir(name)
			}
		case tar.TypeReg:
			if name == "." {
				return fmt.Errorf("%w: file entry names the root", ErrHostile)
			}
			if limit := lim.fileLimit(name); hdr.Size < 0 || hdr.Size > limit {
				return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrHostile, hdr.Name, hdr.Size, limit)
			}
			if total+hdr.Size > lim.MaxTotalBytes {
				return fmt.Errorf("%w: unpacks past %d bytes", ErrHostile, lim.MaxTotalBytes)
			}
			total += hdr.Size
			if _, isDir := m.dirs[name]; isDir {
				return fmt.Errorf("%w: %s is both a file and a directory", ErrHostile, hdr.Name)
			}
			hold, err := budget.admit(hdr.Name, hdr.Size)
			if err != nil {
				return err
			}
			if hold {
				// Read one byte past the declared size so a lying header is caught.
				data, err := io.ReadAll(io.LimitReader(tr, hdr.Size+1))
				if err != nil {
					return readErr(hdr.Name, err)
				}
				if int64(len(data)) != hdr.Size {
					return fmt.Errorf("%w: %s: size mismatch", ErrFormat, hdr.Name)
				}
				m.addFile(name, data)
				return nil
			}
			// Too large to hold: check it reads to its size, keep where it is.
			n, err := io.Copy(io.Discard, tr)
			if err != nil {
				return readErr(hdr.Name, err)
			}
			if n != hdr.Size {
				return fmt.Errorf("%w: %s: size mismatch", ErrFormat, hdr.Name)
			}
			m.addStreamed(name, streamed{entry: i, name: hdr.Name, size: hdr.Size})
		case tar.TypeSymlink, tar.TypeLink:
			return fmt.Errorf("%w: %s is a link (to %q); bundles hold regular files only", ErrHostile, hdr.Name, hdr.Linkname)
		case tar.TypeXGlobalHeader:
			// pax global header: metadata only.
		default:
			return fmt.Errorf("%w: %s has entry type %q; bundles hold regular files and directories only", ErrHostile, hdr.Name, string(hdr.Typeflag))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(m.dirs)-1+len(m.files)+len(m.streamed) > lim.MaxEntries {
		return nil, fmt.Errorf("%w: more than %d entries", ErrHostile, lim.MaxEntries)
	}
	return m, nil
}

func readErr(name string, err error) error {
	if errors.Is(err, errBomb) {
		return err
	}
	return fmt.Errorf("%w: read %s: %v", ErrFormat, name, err)
}

// streamed is a file left in the archive: its entry's ordinal, its name
// there and its size, all checked by the first pass.
type streamed struct {
	entry int
	name  string
	size  int64
}

// open streams one file from the archive: it decompresses up to the
// file's entry (the same bounded pass), then reads from the tar stream as
// the caller reads. Nothing is held but the decompressor's window.
func (a *archive) open(s streamed) (io.ReadCloser, error) {
	gz, err := gzip.NewReader(io.NewSectionReader(a.r, 0, a.size))
	if err != nil {
		return nil, fmt.Errorf("%w: not gzip: %v", ErrFormat, err)
	}
	tr := tar.NewReader(&boundedReader{r: gz, left: a.lim.decompressedLimit()})
	for i := 0; i <= s.entry; i++ {
		hdr, err := tr.Next()
		if errors.Is(err, errBomb) {
			_ = gz.Close() // a reader; the error returned is the one that counts
			return nil, a.bomb()
		}
		if err != nil {
			_ = gz.Close() // a reader; the error returned is the one that counts
			return nil, fmt.Errorf("%w: %s: archive changed since the bundle was opened (%v)", ErrFormat, s.name, err)
		}
		if i == s.entry && (hdr.Name != s.name || hdr.Size != s.size) {
			_ = gz.Close() // a reader; the error returned is the one that counts
			return nil, fmt.Errorf("%w: %s changed since the bundle was opened", ErrFormat, s.name)
		}
	}
	return &entryReader{r: io.LimitReader(tr, s.size), gz: gz}, nil
}

type entryReader struct {
	r  io.Reader
	gz *gzip.Reader
}

func (e *entryReader) Read(p []byte) (int, error) { return e.r.Read(p) }
func (e *entryReader) Close() error               { return e.gz.Close() }
