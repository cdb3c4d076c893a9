package bundle

import (
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// memFS is a read-only file tree of a packed bundle, never unpacked onto
// disk, so a hostile archive cannot write anywhere. Small files are held
// in memory; large ones (streamed) are read from the archive when opened.
type memFS struct {
	files    map[string][]byte          // regular files held, by clean path
	streamed map[string]streamed        // regular files left in the archive
	dirs     map[string]map[string]bool // directory → child names
	arc      *archive                   // where the streamed files are
}

func newMemFS() *memFS {
	return &memFS{files: map[string][]byte{}, streamed: map[string]streamed{}, dirs: map[string]map[string]bool{".": {}}}
}

func (m *memFS) isFile(p string) bool {
	_, held := m.files[p]
	_, str := m.streamed[p]
	return held || str
}

// size is a regular file's size, ok false when p is no file.
func (m *memFS) size(p string) (int64, bool) {
	if data, ok := m.files[p]; ok {
		return int64(len(data)), true
	}
	if s, ok := m.streamed[p]; ok {
		return s.size, true
	}
	return 0, false
}

func (m *memFS) addStreamed(p string, s streamed) {
	dir := path.Dir(p)
	m.addDir(dir)
	m.dirs[dir][path.Base(p)] = true
	delete(m.files, p)
	m.streamed[p] = s
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
	delete(m.streamed, p)
	m.files[p] = data
}

func (m *memFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if data, ok := m.files[name]; ok {
		return &memFile{info: memInfo{name: path.Base(name), size: int64(len(data))}, r: strings.NewReader(string(data))}, nil
	}
	if s, ok := m.streamed[name]; ok {
		rc, err := m.arc.open(s)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &streamFile{info: memInfo{name: path.Base(name), size: s.size}, rc: rc}, nil
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
	if s, ok := m.streamed[name]; ok {
		f, err := m.Open(name)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }() // read-only
		data := make([]byte, s.size)
		if _, err := io.ReadFull(f, data); err != nil {
			return nil, &fs.PathError{Op: "read", Path: name, Err: err}
		}
		return data, nil
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
		if size, isFile := m.size(full); isFile {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: c, size: size}))
		} else {
			out = append(out, fs.FileInfoToDirEntry(memInfo{name: c, dir: true}))
		}
	}
	return out, nil
}

func (m *memFS) Stat(name string) (fs.FileInfo, error) {
	if size, ok := m.size(name); ok {
		return memInfo{name: path.Base(name), size: size}, nil
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

// streamFile is a file read from the archive as it is read.
type streamFile struct {
	info memInfo
	rc   io.ReadCloser
}

func (f *streamFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *streamFile) Read(b []byte) (int, error) { return f.rc.Read(b) }
func (f *streamFile) Close() error               { return f.rc.Close() }

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
