package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/fleetcheck/fleetcheck/node/host/safefs"
)

// dirFS is a directory bundle. Opening it walks the whole tree once and
// applies the packed bundle's rules (limits.go): only regular files,
// directories and links that stay inside; no file past its limit; no more
// bytes or entries than the limits allow. Anything else refuses the bundle.
//
// Every later access goes through os.Root, so no symlink leads out, and
// every file that was not held is opened stat-first with O_NONBLOCK, its
// descriptor fstat'ed and read through a limit (package safefs): a pipe or
// device swapped in after the walk cannot hang or flood the reader.
//
// The small regular files are read ahead into memory in the walk, in
// parallel. os.Root resolves a path one component at a time (an openat
// each), and the probes read hundreds of small sysfs files several
// directories deep: read ahead, the analysis of an 8-GPU / 9-HCA bundle
// opens each file once instead of walking its path again for every read.
// Large files (a big dmesg.txt) are not held: they are read from disk when
// asked, the kernel log as a stream.
type dirFS struct {
	root  *os.Root
	rfs   fs.FS                    // root.FS(): links, and the files not held
	lim   Limits                   // with defaults filled in
	files map[string][]byte        // small regular files read ahead, by clean slash path
	dirs  map[string][]fs.DirEntry // real directories' listings, likewise
}

var (
	_ fs.ReadFileFS = (*dirFS)(nil)
	_ fs.ReadDirFS  = (*dirFS)(nil)
	_ fs.StatFS     = (*dirFS)(nil)
)

// readAheadWorkers overlap the file reads' syscalls.
const readAheadWorkers = 4

// openDir opens a directory bundle, refusing it with ErrHostile when any
// entry breaks the rules.
func openDir(dir string, lim Limits) (*dirFS, error) {
	lim = lim.withDefaults()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	d := &dirFS{root: root, rfs: root.FS(), lim: lim, files: map[string][]byte{}, dirs: map[string][]fs.DirEntry{}}
	var (
		held    []string // small regular files to read ahead
		entries int
		total   int64
		budget  = holdBudget{lim: lim}
		names   int64
	)
	// The walk does not follow symlinks: every directory it lists is a real
	// one under dir.
	var walk func(rel string) error
	walk = func(rel string) error {
		list, err := os.ReadDir(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		d.dirs[rel] = list
		for _, e := range list {
			child := path.Join(rel, e.Name())
			if entries++; entries > lim.MaxEntries {
				return fmt.Errorf("%w: more than %d entries", ErrHostile, lim.MaxEntries)
			}
			if err := checkName(child, &names); err != nil {
				return err
			}
			t := e.Type()
			switch {
			case t.IsDir():
				if err := walk(child); err != nil {
					return err
				}
			case t.IsRegular():
				fi, err := e.Info()
				if err != nil {
					return err
				}
				if limit := lim.fileLimit(child); fi.Size() > limit {
					return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrHostile, child, fi.Size(), limit)
				}
				if total += fi.Size(); total > lim.MaxTotalBytes {
					return fmt.Errorf("%w: files add up to more than %d bytes", ErrHostile, lim.MaxTotalBytes)
				}
				hold, err := budget.admit(child, fi.Size())
				if err != nil {
					return err
				}
				if hold {
					held = append(held, child)
				}
			case t&fs.ModeSymlink != 0:
				if err := d.checkLink(child); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%w: %s is a %s; bundles hold regular files and directories only", ErrHostile, child, safefs.Kind(t))
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		_ = root.Close() // read-only; the walk error is the one to report
		return nil, err
	}
	d.readAhead(dir, held)
	return d, nil
}

// checkLink allows a link that resolves inside the bundle (or nowhere:
// a dangling link reads as absent) and refuses one that leads out.
func (d *dirFS) checkLink(rel string) error {
	fi, err := d.root.Stat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%w: %s is a link that leads out of the bundle or nowhere (%v)", ErrHostile, rel, unwrapPath(err))
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s links to a %s; bundles hold regular files and directories only", ErrHostile, rel, safefs.Kind(fi.Mode()))
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// readAhead reads the small regular files into memory. A file that is no
// longer what the walk saw (swapped for a link, grown past the held size)
// is left out: it is read, with every check, when a probe asks.
func (d *dirFS) readAhead(dir string, paths []string) {
	type read struct {
		rel  string
		data []byte
	}
	jobs := make(chan string)
	out := make(chan read, len(paths))
	var wg sync.WaitGroup
	for range readAheadWorkers {
		wg.Go(func() {
			scratch := make([]byte, 0, 64<<10)
			for rel := range jobs {
				if data, ok := readRegular(filepath.Join(dir, filepath.FromSlash(rel)), d.lim.holdFile(), scratch); ok {
					out <- read{rel, data}
				}
			}
		})
	}
	for _, p := range paths {
		jobs <- p
	}
	close(jobs)
	wg.Wait()
	close(out)
	for r := range out {
		d.files[r.rel] = r.data
	}
}

// readRegular reads a file that the walk saw as regular. O_NOFOLLOW: had it
// been swapped for a symlink since, it is left to os.Root; O_NONBLOCK and
// the fstat: had it been swapped for a pipe or a device, likewise. Plain
// syscalls, not os.File: an os.File tries to register the descriptor with
// the poller first, and this loop runs for every file of the bundle.
//
// Most bundle files are a few bytes (sysfs values): they are read into the
// worker's scratch buffer and copied out at their size.
func readRegular(p string, limit int64, scratch []byte) ([]byte, bool) {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	defer func() { _ = syscall.Close(fd) }() // read-only descriptor
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Size > limit {
		return nil, false
	}
	data := scratch[:0]
	for {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		space := cap(data) - len(data)
		n, err := syscall.Read(fd, data[len(data):cap(data)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n < 0 {
			return nil, false
		}
		data = data[:len(data)+n]
		if int64(len(data)) > limit {
			return nil, false
		}
		// A short read of a regular file is its end.
		if n == 0 || n < space {
			return bytes.Clone(data), true
		}
	}
}

// open opens a file that was not held, by the rules: stat through os.Root
// (a link may not lead out), refuse what is not a regular file or a
// directory before opening it, open without blocking, check the
// descriptor, read through the file's limit.
func (d *dirFS) open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	limit := d.lim.fileLimit(name)
	fi, err := d.root.Stat(name)
	if err != nil {
		return nil, err
	}
	if err := safefs.CheckInfo(name, fi, limit); err != nil {
		return nil, hostile(err)
	}
	f, err := d.root.OpenFile(name, safefs.OpenFlags, 0)
	if err != nil {
		return nil, err
	}
	sf, err := safefs.Wrap(f, name, limit)
	if err != nil {
		return nil, hostile(err)
	}
	return sf, nil
}

// hostile marks a refusal by the file rules as ErrHostile too, so a
// caller tells it from a plain read error.
func hostile(err error) error {
	if errors.Is(err, safefs.ErrNotRegular) || errors.Is(err, safefs.ErrTooLarge) {
		return fmt.Errorf("%w: %w", ErrHostile, err)
	}
	return err
}

func (d *dirFS) Open(name string) (fs.File, error) {
	if data, ok := d.files[name]; ok {
		return &memFile{info: memInfo{name: path.Base(name), size: int64(len(data))}, r: strings.NewReader(string(data))}, nil
	}
	return d.open(name)
}

func (d *dirFS) ReadFile(name string) ([]byte, error) {
	if data, ok := d.files[name]; ok {
		return append([]byte(nil), data...), nil
	}
	f, err := d.open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	if _, isFile := f.(*safefs.File); !isFile {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errIsDir}
	}
	return safefs.ReadAll(f)
}

func (d *dirFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if entries, ok := d.dirs[name]; ok {
		return append([]fs.DirEntry(nil), entries...), nil
	}
	return fs.ReadDir(d.rfs, name)
}

func (d *dirFS) Stat(name string) (fs.FileInfo, error) {
	if data, ok := d.files[name]; ok {
		return memInfo{name: path.Base(name), size: int64(len(data))}, nil
	}
	if _, ok := d.dirs[name]; ok {
		return memInfo{name: path.Base(name), dir: true}, nil
	}
	return fs.Stat(d.rfs, name)
}

// ReadLink keeps what a symlink names (pcisysfs reads a device's driver
// from its link), through os.Root.
func (d *dirFS) ReadLink(name string) (string, error) {
	if rl, ok := d.rfs.(fs.ReadLinkFS); ok {
		return rl.ReadLink(name)
	}
	return "", &fs.PathError{Op: "readlink", Path: name, Err: errors.ErrUnsupported}
}

// Lstat is ReadLinkFS's other half.
func (d *dirFS) Lstat(name string) (fs.FileInfo, error) {
	if rl, ok := d.rfs.(fs.ReadLinkFS); ok {
		return rl.Lstat(name)
	}
	return d.Stat(name)
}
