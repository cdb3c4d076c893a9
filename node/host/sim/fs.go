package sim

import (
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
)

// The node's file tree is built once at New; only file contents are
// rendered when read. Real sysfs is made of symlinks
// (/sys/class/infiniband/mlx5_0 -> ../../devices/.../infiniband/mlx5_0), and
// so is this tree: readers that trust DirEntry.IsDir instead of following
// the links fail here as they would on a live machine.

type nodeKind uint8

const (
	kindDir nodeKind = iota
	kindFile
	kindLink
)

// renderFunc appends a file's content. owner is the index that the
// nearest enclosing directory declares (a PCI function, an HCA).
type renderFunc func(v *fsView, owner int, b []byte) []byte

type fsNode struct {
	name     string
	kind     nodeKind
	owner    int       // for directories: the index files below render for; -1 inherits
	children []*fsNode // sorted by name; shared subtrees appear under several parents
	target   string    // symlink target, relative to the link's directory
	render   renderFunc
	proc     bool // /proc files report size 0

	// Resolved at build time, since links never change: the node a link
	// points to and the owner in force there, so reads allocate nothing.
	to      *fsNode
	toOwner int
}

type fsTree struct{ root *fsNode }

// Shared lets nodes of the same shape (bus addresses, HCA names) share
// their file-tree layout, which never changes after New: a simulated fleet
// of a thousand identical nodes then holds one tree. The zero value is ready
// to use; it is safe for concurrent use.
type Shared struct {
	mu    sync.Mutex
	trees map[string]*fsTree
}

// NewShared returns an empty Shared for Spec.Shared.
func NewShared() *Shared { return &Shared{trees: map[string]*fsTree{}} }

func (sh *Shared) tree(shape string, build func() *fsTree) *fsTree {
	if sh == nil {
		return build()
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if t, ok := sh.trees[shape]; ok {
		return t
	}
	if sh.trees == nil {
		sh.trees = map[string]*fsTree{}
	}
	t := build()
	sh.trees[shape] = t
	return t
}

func newDir(name string, owner int) *fsNode {
	return &fsNode{name: name, kind: kindDir, owner: owner}
}

func (d *fsNode) add(c *fsNode) *fsNode {
	d.children = append(d.children, c)
	return c
}

// dir returns the named subdirectory, creating it. Build time only: the
// entries are sorted once the tree is complete.
func (d *fsNode) dir(name string) *fsNode {
	for _, c := range d.children {
		if c.name == name {
			return c
		}
	}
	return d.add(newDir(name, -1))
}

func (d *fsNode) file(name string, r renderFunc) {
	d.add(&fsNode{name: name, kind: kindFile, owner: -1, render: r})
}

func (d *fsNode) link(name, target string) {
	d.add(&fsNode{name: name, kind: kindLink, owner: -1, target: target})
}

func (d *fsNode) sort() {
	slices.SortFunc(d.children, func(a, b *fsNode) int { return strings.Compare(a.name, b.name) })
}

func (d *fsNode) child(name string) *fsNode {
	i, ok := slices.BinarySearchFunc(d.children, name, func(c *fsNode, n string) int { return strings.Compare(c.name, n) })
	if !ok {
		return nil
	}
	return d.children[i]
}

// mkdirAll walks p from d, creating directories.
func (d *fsNode) mkdirAll(p string) *fsNode {
	for _, c := range strings.Split(p, "/") {
		d = d.dir(c)
	}
	return d
}

// maxLinkHops bounds symlink resolution, as the kernel's ELOOP does.
const maxLinkHops = 40

// resolve finds name, following symlinks in every component and in the
// last one when follow is set. It returns the node and the owner in force.
func (t *fsTree) resolve(name string, follow bool) (*fsNode, int, error) {
	if !fs.ValidPath(name) {
		return nil, -1, fs.ErrInvalid
	}
	cur, owner := t.root, -1
	if name == "." {
		return cur, owner, nil
	}
	for i := 0; ; {
		comp, last := name[i:], true
		if j := strings.IndexByte(comp, '/'); j >= 0 {
			comp, last = comp[:j], false
		}
		if cur.kind != kindDir {
			return nil, -1, fs.ErrNotExist
		}
		c := cur.child(comp)
		if c == nil {
			return nil, -1, fs.ErrNotExist
		}
		if c.kind == kindLink && (!last || follow) {
			if c.to == nil {
				return nil, -1, fs.ErrNotExist // dangling
			}
			c, owner = c.to, c.toOwner
		} else if c.owner >= 0 {
			owner = c.owner
		}
		cur = c
		if last {
			return cur, owner, nil
		}
		i += len(comp) + 1
	}
}

// resolveText resolves a path that may pass through links by rewriting it,
// used once per link while the tree is built.
func (t *fsTree) resolveText(name string) (*fsNode, int, error) {
	p := name
	for range maxLinkHops {
		cur, owner := t.root, -1
		if p == "." {
			return cur, owner, nil
		}
		i := 0
		relinked := false
		for !relinked {
			comp, last := p[i:], true
			if j := strings.IndexByte(comp, '/'); j >= 0 {
				comp, last = comp[:j], false
			}
			if cur.kind != kindDir {
				return nil, -1, fs.ErrNotExist
			}
			c := cur.child(comp)
			if c == nil {
				return nil, -1, fs.ErrNotExist
			}
			if c.kind == kindLink {
				np := path.Join(p[:i], c.target)
				if !last {
					np = path.Join(np, p[i+len(comp)+1:])
				}
				if np == ".." || strings.HasPrefix(np, "../") {
					return nil, -1, fs.ErrNotExist
				}
				p = np
				relinked = true
				continue
			}
			cur = c
			if c.owner >= 0 {
				owner = c.owner
			}
			if last {
				return cur, owner, nil
			}
			i += len(comp) + 1
		}
	}
	return nil, -1, fs.ErrNotExist
}

// finish sorts every directory, resolves every link and builds listings.
func (t *fsTree) finish() {
	seen := map[*fsNode]bool{}
	var links []struct {
		nd  *fsNode
		dir string
	}
	var walk func(d *fsNode, dir string)
	walk = func(d *fsNode, dir string) {
		if seen[d] {
			return
		}
		seen[d] = true
		d.sort()
		for _, c := range d.children {
			p := path.Join(dir, c.name)
			switch c.kind {
			case kindDir:
				walk(c, p)
			case kindLink:
				links = append(links, struct {
					nd  *fsNode
					dir string
				}{c, dir})
			}
		}
	}
	walk(t.root, "")
	for _, l := range links {
		if to, owner, err := t.resolveText(path.Join(l.dir, l.nd.target)); err == nil {
			l.nd.to, l.nd.toOwner = to, owner
		}
	}
}

// fsView is one snapshot of the tree: files render at its frame's time.
type fsView struct {
	n *Node
	f frame

	mu      sync.Mutex
	symbols map[int]uint64 // symbol_error per HCA, fixed at its first read in this view
}

var (
	_ fs.ReadFileFS = (*fsView)(nil)
	_ fs.ReadDirFS  = (*fsView)(nil)
	_ fs.StatFS     = (*fsView)(nil)
	_ fs.ReadLinkFS = (*fsView)(nil)
)

// symbol is the port's symbol_error in this view: the first read in a view
// advances a rising counter; later reads in the same view agree with it.
func (v *fsView) symbol(h int) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if s, ok := v.symbols[h]; ok {
		return s
	}
	if v.symbols == nil {
		v.symbols = make(map[int]uint64)
	}
	s := v.n.readSymbol(h, v.f.v)
	v.symbols[h] = s
	return s
}

func pathErr(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// Open opens name, following symlinks.
func (v *fsView) Open(name string) (fs.File, error) {
	nd, owner, err := v.n.tree.resolve(name, true)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	if nd.kind == kindDir {
		return &dirFile{v: v, nd: nd, info: v.info(nd, path.Base(name))}, nil
	}
	f := &memFile{info: v.info(nd, path.Base(name))}
	f.data = nd.render(v, owner, f.buf[:0])
	return f, nil
}

// ReadFile reads a whole file.
func (v *fsView) ReadFile(name string) ([]byte, error) {
	nd, owner, err := v.n.tree.resolve(name, true)
	if err != nil {
		return nil, pathErr("readfile", name, err)
	}
	if nd.kind == kindDir {
		return nil, pathErr("read", name, errIsDir)
	}
	return nd.render(v, owner, nil), nil
}

// ReadDir lists a directory, sorted by name; symlinks stay symlinks.
func (v *fsView) ReadDir(name string) ([]fs.DirEntry, error) {
	nd, _, err := v.n.tree.resolve(name, true)
	if err != nil {
		return nil, pathErr("readdir", name, err)
	}
	if nd.kind != kindDir {
		return nil, pathErr("readdir", name, errNotDir)
	}
	return v.entries(nd), nil
}

// Stat describes name, following symlinks.
func (v *fsView) Stat(name string) (fs.FileInfo, error) {
	nd, _, err := v.n.tree.resolve(name, true)
	if err != nil {
		return nil, pathErr("stat", name, err)
	}
	return v.info(nd, path.Base(name)), nil
}

// Lstat describes name without following a final symlink.
func (v *fsView) Lstat(name string) (fs.FileInfo, error) {
	nd, _, err := v.n.tree.resolve(name, false)
	if err != nil {
		return nil, pathErr("lstat", name, err)
	}
	return v.info(nd, path.Base(name)), nil
}

// ReadLink returns a symlink's target.
func (v *fsView) ReadLink(name string) (string, error) {
	nd, _, err := v.n.tree.resolve(name, false)
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	if nd.kind != kindLink {
		return "", pathErr("readlink", name, fs.ErrInvalid)
	}
	return nd.target, nil
}

type fsError string

func (e fsError) Error() string { return string(e) }

const (
	errIsDir  fsError = "is a directory"
	errNotDir fsError = "not a directory"
)

// entries lists a directory in two allocations, whatever its size.
func (v *fsView) entries(nd *fsNode) []fs.DirEntry {
	es := make([]dirEntry, len(nd.children))
	out := make([]fs.DirEntry, len(nd.children))
	for i, c := range nd.children {
		es[i] = dirEntry{nd: c, mod: v.f.boot}
		out[i] = &es[i]
	}
	return out
}

func (v *fsView) info(nd *fsNode, name string) fileInfo { return nodeInfo(nd, name, v.f.boot) }

func nodeInfo(nd *fsNode, name string, mod time.Time) fileInfo {
	fi := fileInfo{name: name, mod: mod}
	switch nd.kind {
	case kindDir:
		fi.mode = fs.ModeDir | 0o555
	case kindLink:
		fi.mode = fs.ModeSymlink | 0o777
	default:
		fi.mode = 0o444
		if !nd.proc {
			fi.size = 4096 // what sysfs reports for every attribute
		}
	}
	return fi
}

type fileInfo struct {
	name string
	size int64
	mode fs.FileMode
	mod  time.Time
}

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return fi.size }
func (fi fileInfo) Mode() fs.FileMode  { return fi.mode }
func (fi fileInfo) ModTime() time.Time { return fi.mod }
func (fi fileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi fileInfo) Sys() any           { return nil }

type dirEntry struct {
	nd  *fsNode
	mod time.Time
}

func (d *dirEntry) Name() string               { return d.nd.name }
func (d *dirEntry) IsDir() bool                { return d.nd.kind == kindDir }
func (d *dirEntry) Type() fs.FileMode          { return nodeInfo(d.nd, "", d.mod).mode.Type() }
func (d *dirEntry) Info() (fs.FileInfo, error) { return nodeInfo(d.nd, d.nd.name, d.mod), nil }

// memFile is an open file; small attribute values fit in buf, so opening
// one costs a single allocation.
type memFile struct {
	info fileInfo
	data []byte
	off  int
	buf  [48]byte
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Close() error               { return nil }
func (f *memFile) Read(p []byte) (int, error) {
	if f.off >= len(f.data) {
		return 0, io.EOF
	}
	k := copy(p, f.data[f.off:])
	f.off += k
	return k, nil
}

type dirFile struct {
	v    *fsView
	nd   *fsNode
	info fileInfo
	off  int
}

func (d *dirFile) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *dirFile) Close() error               { return nil }
func (d *dirFile) Read([]byte) (int, error) {
	return 0, pathErr("read", d.info.name, errIsDir)
}

// ReadDir implements fs.ReadDirFile.
func (d *dirFile) ReadDir(count int) ([]fs.DirEntry, error) {
	all := d.v.entries(d.nd)[d.off:]
	if count <= 0 {
		d.off += len(all)
		return all, nil
	}
	if len(all) == 0 {
		return nil, io.EOF
	}
	k := min(count, len(all))
	d.off += k
	return all[:k], nil
}
