// Package deb writes Debian binary packages (.deb) with the standard
// library only: an ar archive of debian-binary, control.tar.gz and
// data.tar.gz (deb(5)). It knows nothing of fleetcheck; the packager in
// cmd/fleetcheck-package says what goes in.
package deb

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Package is one binary package.
type Package struct {
	Name         string   // lowercase, [a-z0-9.+-]
	Version      string   // Debian version: starts with a digit
	Architecture string   // amd64, arm64, all
	Maintainer   string   // "Name <mail>"
	Description  string   // first line is the synopsis; later lines are the long text
	Depends      []string // e.g. "libc6 (>= 2.34)"
	Recommends   []string
	Section      string // default "admin"
	Homepage     string
	Files        []File
	Dirs         []Dir
	// Scripts are maintainer scripts by name (preinst, postinst, prerm,
	// postrm): shell text, installed 0755.
	Scripts map[string]string
}

// File is one regular file in the package.
type File struct {
	Path     string // absolute, e.g. /usr/bin/fleetcheck-node
	Body     []byte
	Mode     int64 // permission bits, e.g. 0o755
	Conffile bool  // kept as the admin edited it across upgrades (under /etc only)
}

// Dir is an empty directory the package owns (parents of files are added
// by themselves).
type Dir struct {
	Path string
	Mode int64
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]+$`)
	versionRE = regexp.MustCompile(`^([0-9]+:)?[0-9][A-Za-z0-9.+~-]*$`)
	archRE    = regexp.MustCompile(`^[a-z0-9-]+$`)
	scripts   = []string{"preinst", "postinst", "prerm", "postrm"}
)

// ErrInvalid is returned for a package that dpkg would refuse.
var ErrInvalid = errors.New("invalid package")

func (p *Package) validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	switch {
	case !nameRE.MatchString(p.Name):
		return bad("name %q: lowercase letters, digits, '.', '+', '-'", p.Name)
	case !versionRE.MatchString(p.Version):
		return bad("version %q: a Debian version starts with a digit", p.Version)
	case !archRE.MatchString(p.Architecture):
		return bad("architecture %q", p.Architecture)
	case p.Maintainer == "" || p.Description == "":
		return bad("maintainer and description are required")
	}
	seen := map[string]bool{}
	for _, f := range p.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return bad("file path %q: absolute and clean", f.Path)
		}
		if seen[f.Path] {
			return bad("file %s listed twice", f.Path)
		}
		seen[f.Path] = true
		if f.Conffile && !strings.HasPrefix(f.Path, "/etc/") {
			return bad("conffile %s: conffiles live under /etc", f.Path)
		}
	}
	for _, d := range p.Dirs {
		if !path.IsAbs(d.Path) || path.Clean(d.Path) != d.Path {
			return bad("dir path %q: absolute and clean", d.Path)
		}
	}
	for name := range p.Scripts {
		if !slices.Contains(scripts, name) {
			return bad("maintainer script %q: one of %s", name, strings.Join(scripts, ", "))
		}
	}
	return nil
}

// FileName is the package's conventional file name.
func (p *Package) FileName() string {
	v := p.Version
	if i := strings.IndexByte(v, ':'); i >= 0 {
		v = v[i+1:] // the epoch is not part of the file name
	}
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, v, p.Architecture)
}

// Write writes the package to w. mtime stamps every entry, so the same
// inputs give the same bytes.
func (p *Package) Write(w io.Writer, mtime time.Time) error {
	if err := p.validate(); err != nil {
		return err
	}
	data, size, err := p.dataTar(mtime)
	if err != nil {
		return err
	}
	control, err := p.controlTar(mtime, size)
	if err != nil {
		return err
	}
	ar := &arWriter{w: w, mtime: mtime}
	ar.header()
	ar.file("debian-binary", []byte("2.0\n"))
	ar.file("control.tar.gz", control)
	ar.file("data.tar.gz", data)
	return ar.err
}

// dataTar is data.tar.gz and the installed size in KiB.
func (p *Package) dataTar(mtime time.Time) ([]byte, int64, error) {
	dirs := map[string]int64{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for _, f := range p.Files {
		addParents(f.Path)
	}
	for _, d := range p.Dirs {
		addParents(d.Path)
		dirs[d.Path] = d.Mode
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	slices.Sort(names)
	files := slices.Clone(p.Files)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })

	var buf bytes.Buffer
	tw, gz := newTarGz(&buf)
	var size int64
	hdr := func(h *tar.Header) error {
		h.Uname, h.Gname, h.ModTime, h.Format = "root", "root", mtime, tar.FormatGNU
		return tw.WriteHeader(h)
	}
	if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}); err != nil {
		return nil, 0, err
	}
	for _, d := range names {
		if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: "." + d + "/", Mode: dirs[d]}); err != nil {
			return nil, 0, err
		}
		size++
	}
	for _, f := range files {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "." + f.Path, Mode: f.Mode, Size: int64(len(f.Body))}); err != nil {
			return nil, 0, err
		}
		if _, err := tw.Write(f.Body); err != nil {
			return nil, 0, err
		}
		size += (int64(len(f.Body)) + 1023) / 1024
	}
	if err := closeTarGz(tw, gz); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), size, nil
}

func (p *Package) controlTar(mtime time.Time, installedKiB int64) ([]byte, error) {
	var c strings.Builder
	field := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&c, "%s: %s\n", k, v)
		}
	}
	section := p.Section
	if section == "" {
		section = "admin"
	}
	field("Package", p.Name)
	field("Version", p.Version)
	field("Architecture", p.Architecture)
	field("Maintainer", p.Maintainer)
	field("Installed-Size", strconv.FormatInt(installedKiB, 10))
	field("Depends", strings.Join(p.Depends, ", "))
	field("Recommends", strings.Join(p.Recommends, ", "))
	field("Section", section)
	field("Priority", "optional")
	field("Homepage", p.Homepage)
	synopsis, long, _ := strings.Cut(strings.TrimSpace(p.Description), "\n")
	fmt.Fprintf(&c, "Description: %s\n", synopsis)
	for _, l := range strings.Split(long, "\n") {
		if l = strings.TrimSpace(l); l == "" {
			if long != "" {
				c.WriteString(" .\n")
			}
			continue
		}
		c.WriteString(" " + l + "\n")
	}

	var md5sums, conffiles strings.Builder
	files := slices.Clone(p.Files)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range files {
		fmt.Fprintf(&md5sums, "%x  %s\n", md5.Sum(f.Body), strings.TrimPrefix(f.Path, "/"))
		if f.Conffile {
			conffiles.WriteString(f.Path + "\n")
		}
	}

	var buf bytes.Buffer
	tw, gz := newTarGz(&buf)
	add := func(name string, body string, mode int64) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: "./" + name, Mode: mode, Size: int64(len(body)),
			Uname: "root", Gname: "root", ModTime: mtime, Format: tar.FormatGNU}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := io.WriteString(tw, body)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, Uname: "root", Gname: "root", ModTime: mtime, Format: tar.FormatGNU}); err != nil {
		return nil, err
	}
	if err := add("control", c.String(), 0o644); err != nil {
		return nil, err
	}
	if err := add("md5sums", md5sums.String(), 0o644); err != nil {
		return nil, err
	}
	if conffiles.Len() > 0 {
		if err := add("conffiles", conffiles.String(), 0o644); err != nil {
			return nil, err
		}
	}
	for _, name := range scripts {
		if s, ok := p.Scripts[name]; ok {
			if err := add(name, s, 0o755); err != nil {
				return nil, err
			}
		}
	}
	if err := closeTarGz(tw, gz); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func newTarGz(w io.Writer) (*tar.Writer, *gzip.Writer) {
	gz, _ := gzip.NewWriterLevel(w, gzip.DefaultCompression) // the level is valid
	return tar.NewWriter(gz), gz
}

func closeTarGz(tw *tar.Writer, gz *gzip.Writer) error {
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// arWriter writes the common ar format dpkg reads: a global header, then
// per member a 60-byte header and the body padded to an even length.
type arWriter struct {
	w     io.Writer
	mtime time.Time
	err   error
}

func (a *arWriter) write(b []byte) {
	if a.err == nil {
		_, a.err = a.w.Write(b)
	}
}

func (a *arWriter) header() { a.write([]byte("!<arch>\n")) }

func (a *arWriter) file(name string, body []byte) {
	h := fmt.Sprintf("%-16s%-12d%-6d%-6d%-8o%-10d`\n", name, a.mtime.Unix(), 0, 0, 0o100644, len(body))
	a.write([]byte(h))
	a.write(body)
	if len(body)%2 == 1 {
		a.write([]byte("\n"))
	}
}
