package bundle

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// dirFS is a directory bundle: every access goes through os.Root, so no
// symlink leads out of the bundle, but the regular files are read ahead
// into memory in one walk, in parallel. os.Root resolves a path one
// component at a time (an openat each), and the probes read hundreds of
// small sysfs files several directories deep: read ahead, the analysis
// of an 8-GPU / 9-HCA bundle opens each file once instead of walking its
// path again for every read.
type dirFS struct {
	root  fs.FS                    // os.Root's FS: links, and what was not read ahead
	files map[string][]byte        // regular files read ahead, by clean slash path
	dirs  map[string][]fs.DirEntry // real directories' listings, likewise
}

var (
	_ fs.ReadFileFS = (*dirFS)(nil)
	_ fs.ReadDirFS  = (*dirFS)(nil)
	_ fs.StatFS     = (*dirFS)(nil)
)

// readAheadWorkers overlap the file reads' syscalls.
const readAheadWorkers = 4

// openDir opens a directory bundle. Files past lim (one too large, or the
// total) are not read ahead; they are still read, through os.Root, when a
// probe asks.
func openDir(dir string, lim Limits) (*dirFS, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	d := &dirFS{root: root.FS(), files: map[string][]byte{}, dirs: map[string][]fs.DirEntry{}}
	var paths []string
	// The walk does not follow symlinks: every directory it lists is a real
	// one under dir, and every path it keeps names a regular file there.
	var walk func(rel string) error
	walk = func(rel string) error {
		entries, err := os.ReadDir(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		d.dirs[rel] = entries
		for _, e := range entries {
			child := path.Join(rel, e.Name())
			switch {
			case len(paths)+len(d.dirs) > lim.MaxEntries:
				return nil // the rest is read through os.Root when asked
			case e.IsDir():
				if err := walk(child); err != nil {
					return err
				}
			case e.Type().IsRegular():
				paths = append(paths, child)
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		return nil, err
	}
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
				if data, ok := readRegular(filepath.Join(dir, filepath.FromSlash(rel)), lim.MaxFileBytes, scratch); ok {
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
	var total int64
	for r := range out {
		if total += int64(len(r.data)); total > lim.MaxTotalBytes {
			break
		}
		d.files[r.rel] = r.data
	}
	return d, nil
}

// readRegular reads a file that the walk saw as regular. O_NOFOLLOW: had it
// been swapped for a symlink since, it is left to os.Root. Plain syscalls,
// not os.File: an os.File tries to register the descriptor with the
// poller first, and this loop runs for every file of the bundle.
//
// Most bundle files are a few bytes (sysfs values): they are read into the
// worker's scratch buffer and copied out at their size.
func readRegular(p string, limit int64, scratch []byte) ([]byte, bool) {
	fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	defer syscall.Close(fd)
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

func (d *dirFS) Open(name string) (fs.File, error) {
	if data, ok := d.files[name]; ok {
		return &memFile{info: memInfo{name: path.Base(name), size: int64(len(data))}, r: strings.NewReader(string(data))}, nil
	}
	return d.root.Open(name)
}

func (d *dirFS) ReadFile(name string) ([]byte, error) {
	if data, ok := d.files[name]; ok {
		return append([]byte(nil), data...), nil
	}
	return fs.ReadFile(d.root, name)
}

func (d *dirFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if entries, ok := d.dirs[name]; ok {
		return append([]fs.DirEntry(nil), entries...), nil
	}
	return fs.ReadDir(d.root, name)
}

func (d *dirFS) Stat(name string) (fs.FileInfo, error) {
	if data, ok := d.files[name]; ok {
		return memInfo{name: path.Base(name), size: int64(len(data))}, nil
	}
	if _, ok := d.dirs[name]; ok {
		return memInfo{name: path.Base(name), dir: true}, nil
	}
	return fs.Stat(d.root, name)
}

// ReadLink keeps what a symlink names (pcisysfs reads a device's driver
// from its link), through os.Root.
func (d *dirFS) ReadLink(name string) (string, error) {
	if rl, ok := d.root.(fs.ReadLinkFS); ok {
		return rl.ReadLink(name)
	}
	return "", &fs.PathError{Op: "readlink", Path: name, Err: errors.ErrUnsupported}
}

// Lstat is ReadLinkFS's other half.
func (d *dirFS) Lstat(name string) (fs.FileInfo, error) {
	if rl, ok := d.root.(fs.ReadLinkFS); ok {
		return rl.Lstat(name)
	}
	return d.Stat(name)
}
