// Package safefs reads files that may be hostile or odd (a named pipe, a
// device node, a sparse or growing file) without blocking and without
// reading past a size limit. A support bundle from another machine and the
// live /sys and /proc trees both go through it.
//
// The rule is the same everywhere: stat first and open only regular files
// and directories (opening some devices acts: /dev/watchdog arms a timer);
// open with O_NONBLOCK so a pipe swapped in after the stat cannot hang the
// open; fstat the opened descriptor and refuse it unless it is still a
// regular file or a directory; and read through a limit, since a file can
// grow after its stat and /proc files report size 0.
package safefs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

var (
	// ErrNotRegular marks a file that is neither a regular file nor a
	// directory: a named pipe, a device node, a socket.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge marks a file past its size limit.
	ErrTooLarge = errors.New("over the size limit")
)

// OpenFlags open for reading without ever blocking on a pipe or a device
// that waits for a peer.
const OpenFlags = os.O_RDONLY | syscall.O_NONBLOCK

// CheckInfo refuses what is neither a regular file nor a directory, and a
// regular file larger than limit. name is for the error.
func CheckInfo(name string, fi fs.FileInfo, limit int64) error {
	switch {
	case fi.IsDir():
		return nil
	case !fi.Mode().IsRegular():
		return &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w: %s", ErrNotRegular, Kind(fi.Mode()))}
	case fi.Size() > limit:
		return &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, fi.Size(), limit)}
	}
	return nil
}

// Kind names a file type for a message ("named pipe", "character device").
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeIrregular != 0:
		return "irregular file"
	case m.IsDir():
		return "directory"
	}
	return "regular file"
}

// Wrap checks a freshly opened file by its descriptor and returns it
// bounded to limit bytes; on refusal it closes f. A directory comes back
// as it is, for ReadDir.
func Wrap(f *os.File, name string, limit int64) (fs.File, error) {
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close() // read-only; the error returned is the one that counts
		return nil, err
	}
	if err := CheckInfo(name, fi, limit); err != nil {
		_ = f.Close() // read-only; the error returned is the one that counts
		return nil, err
	}
	if fi.IsDir() {
		return f, nil
	}
	// A regular file after all: back to blocking reads (a few /sys files
	// would answer EAGAIN otherwise).
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = syscall.SetNonblock(int(fd), false) })
	}
	return &File{f: f, name: name, left: limit, limit: limit}, nil
}

// File is a regular file read through a limit: reading more than limit
// bytes fails with ErrTooLarge instead of going on.
type File struct {
	f     *os.File
	name  string
	left  int64
	limit int64
}

// Read reads at most the limit; one byte past it is an error.
func (f *File) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if f.left <= 0 {
		var one [1]byte
		n, err := f.f.Read(one[:])
		if n > 0 {
			return 0, &fs.PathError{Op: "read", Path: f.name, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, f.limit)}
		}
		return 0, err
	}
	if int64(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.f.Read(p)
	f.left -= int64(n)
	return n, err
}

// Stat is the descriptor's stat.
func (f *File) Stat() (fs.FileInfo, error) { return f.f.Stat() }

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }

// ReadAll reads a whole opened file; a regular file's stat size sizes the
// buffer (bounded by the file's own limit), so a 4 KiB sysfs value costs
// one allocation.
func ReadAll(f fs.File) ([]byte, error) {
	size := 512
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		s := fi.Size()
		if bf, ok := f.(*File); ok && s > bf.limit {
			s = bf.limit
		}
		size = int(s) + 1
	}
	buf := make([]byte, 0, size)
	for {
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// DirFS is the file tree under dir, like os.DirFS, with the rules above:
// links are followed (sysfs is made of them; this is for the local
// machine's own trees), but only regular files and directories open, and
// no file reads past limit bytes.
type DirFS struct {
	dir   string
	limit int64
}

// NewDirFS returns the tree under dir with a per-file limit.
func NewDirFS(dir string, limit int64) DirFS { return DirFS{dir: dir, limit: limit} }

var (
	_ fs.ReadFileFS = DirFS{}
	_ fs.ReadDirFS  = DirFS{}
	_ fs.StatFS     = DirFS{}
	_ fs.ReadLinkFS = DirFS{}
)

func (d DirFS) join(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return filepath.Join(d.dir, filepath.FromSlash(name)), nil
}

// Open opens a regular file or a directory, refusing anything else before
// it is opened.
func (d DirFS) Open(name string) (fs.File, error) {
	p, err := d.join("open", name)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if err := CheckInfo(name, fi, d.limit); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, OpenFlags|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return Wrap(f, name, d.limit)
}

// ReadFile reads a whole regular file within the limit.
func (d DirFS) ReadFile(name string) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	if _, ok := f.(*File); !ok {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("is a directory")}
	}
	return ReadAll(f)
}

// ReadDir lists a directory.
func (d DirFS) ReadDir(name string) ([]fs.DirEntry, error) {
	p, err := d.join("readdir", name)
	if err != nil {
		return nil, err
	}
	return os.ReadDir(p)
}

// Stat follows links.
func (d DirFS) Stat(name string) (fs.FileInfo, error) {
	p, err := d.join("stat", name)
	if err != nil {
		return nil, err
	}
	return os.Stat(p)
}

// Lstat does not follow a final link.
func (d DirFS) Lstat(name string) (fs.FileInfo, error) {
	p, err := d.join("lstat", name)
	if err != nil {
		return nil, err
	}
	return os.Lstat(p)
}

// ReadLink says what a link names (a PCI device's driver).
func (d DirFS) ReadLink(name string) (string, error) {
	p, err := d.join("readlink", name)
	if err != nil {
		return "", err
	}
	return os.Readlink(p)
}
