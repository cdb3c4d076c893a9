package bundle

import (
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// memFS is a read-only in-memory file tree: a packed bundle is unpacked into
// memory, never onto disk, so a hostile archive cannot write anywhere.
type memFS struct {
	files map[string][]byte          // regular files by clean path
	dirs  map[string]map[string]bool // directory → child names
}

func newMemFS() *memFS {
	return &memFS{files: map[string][]byte{}, dirs: map[string]map[string]bool{".": {}}}
}

func (m *memFS) addDir(p string) {
	for p != "." {
		parent, name := path.Split(p)
		parent = strings.TrimSuffix(parent, "/")
		if parent == "" {
			parent = "."
		}
		if m.dirs[p] == nil {
			m.dirs[p] = map[string]bool{}
		}
		if m.dirs[parent] == nil {
			m.dirs[parent] = map[string]bool{}
		}
		m.dirs[parent][name] = true
		p = parent
	}
}

func (m *memFS) addFile(p string, data []byte) {
	dir := path.Dir(p)
	m.addDir(dir)
	m.dirs[dir][path.Base(p)] = true
	m.files[p] = data
}

func (m *memFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if data, ok := m.files[name]; ok {
		return &memFile{info: memInfo{name: path.Base(name), size: int64(len(data))}, r: strings.NewReader(string(data))}, nil
	}
	if _, ok := m.dirs[name]; ok {
		entries, _ := m.ReadDir(name)
		return &memDir{info: memInfo{name: path.Base(name), dir: true}, entries: entries}, nil
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (m *memFS) ReadFile(name string) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrInvalid}
	}
	data, ok := m.files[name]
	if !ok {
		if _, isDir := m.dirs[name]; isDir {
			return nil, &fs.PathError{Op: "read", Path: name, Err: errIsDir}
		}
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return append([]byte(nil), data...), nil
}

func (m *memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	children, ok := m.dirs[name]
	if !ok {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	names := make([]string, 0, len(children))
	for c := range children {
		names = append(names, c)
	}
	sort.Strings(names)
	out := make([]fs.DirEntry, 0, len(names))
	for _, c := range names {
		full := path.Join(name, c)
		if data, isFile := m.files[full]; isFile {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: c, size: int64(len(data))}))
		} else {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: c, dir: true}))
		}
	}
	return out, nil
}

func (m *memFS) Stat(name string) (fs.FileInfo, error) {
	if data, ok := m.files[name]; ok {
		return memInfo{name: path.Base(name), size: int64(len(data))}, nil
	}
	if _, ok := m.dirs[name]; ok {
		return memInfo{name: path.Base(name), dir: true}, nil
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

type errString string

func (e errString) Error() string { return string(e) }

const errIsDir = errString("is a directory")

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string { return i.name }
func (i memInfo) Size() int64  { return i.size }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }

type memFile struct {
	info memInfo
	r    *strings.Reader
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Read(b []byte) (int, error) { return f.r.Read(b) }
func (f *memFile) Close() error               { return nil }

type memDir struct {
	info    memInfo
	entries []fs.DirEntry
	off     int
}

func (d *memDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.info.name, Err: errIsDir}
}
func (d *memDir) Close() error { return nil }
func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.off:]
	if n <= 0 {
		d.off = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	if n > len(rest) {
		n = len(rest)
	}
	d.off += n
	return rest[:n], nil
}
