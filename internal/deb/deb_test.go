package deb

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func valid() Package {
	return Package{
		Name: "fleetcheck-node", Version: "1.2.0", Architecture: "amd64", Maintainer: "m <m@x>",
		Description: "synopsis\n long text\n\n more",
		Files: []File{
			{Path: "/usr/bin/tool", Body: []byte("#!/bin/sh\n"), Mode: 0o755},
			{Path: "/etc/tool/tool.yaml", Body: []byte("a: 1\n"), Mode: 0o644, Conffile: true},
		},
		Dirs:    []Dir{{Path: "/var/lib/tool", Mode: 0o700}},
		Scripts: map[string]string{"postinst": "#!/bin/sh\nexit 0\n"},
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*Package)
	}{
		{"upper-case name", func(p *Package) { p.Name = "Fleetcheck" }},
		{"version without a digit first", func(p *Package) { p.Version = "v1.2.0" }},
		{"empty version", func(p *Package) { p.Version = "" }},
		{"version with a space", func(p *Package) { p.Version = "1.2 0" }},
		{"architecture with a slash", func(p *Package) { p.Architecture = "amd/64" }},
		{"no maintainer", func(p *Package) { p.Maintainer = "" }},
		{"relative path", func(p *Package) { p.Files[0].Path = "usr/bin/tool" }},
		{"unclean path", func(p *Package) { p.Files[0].Path = "/usr/bin/../../etc/shadow" }},
		{"file twice", func(p *Package) { p.Files = append(p.Files, p.Files[0]) }},
		{"conffile outside /etc", func(p *Package) { p.Files[0].Conffile = true }},
		{"unknown script", func(p *Package) { p.Scripts["config"] = "#!/bin/sh\n" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			p.Files = append([]File(nil), p.Files...)
			p.Scripts = map[string]string{"postinst": p.Scripts["postinst"]}
			tc.edit(&p)
			var buf bytes.Buffer
			if err := p.Write(&buf, time.Unix(0, 0)); !errors.Is(err, ErrInvalid) {
				t.Errorf("Write: %v, want ErrInvalid", err)
			}
			if buf.Len() > 0 {
				t.Errorf("an invalid package still wrote %d bytes", buf.Len())
			}
		})
	}
}

// members reads an ar archive's member names and sizes, checking the
// framing dpkg relies on.
func members(t *testing.T, b []byte) []string {
	t.Helper()
	if !bytes.HasPrefix(b, []byte("!<arch>\n")) {
		t.Fatalf("no ar magic: %q", b[:min(8, len(b))])
	}
	var names []string
	for off := 8; off < len(b); {
		if off+60 > len(b) {
			t.Fatalf("truncated header at %d", off)
		}
		h := b[off : off+60]
		if string(h[58:60]) != "`\n" {
			t.Fatalf("bad header end at %d: %q", off, h)
		}
		size, err := strconv.Atoi(strings.TrimSpace(string(h[48:58])))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, strings.TrimSpace(string(h[:16])))
		off += 60 + size + size%2
	}
	return names
}

func TestWriteIsDeterministic(t *testing.T) {
	t.Parallel()
	p := valid()
	var a, b bytes.Buffer
	mtime := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if err := p.Write(&a, mtime); err != nil {
		t.Fatal(err)
	}
	// The same inputs listed in another order give the same bytes.
	p.Files[0], p.Files[1] = p.Files[1], p.Files[0]
	if err := p.Write(&b, mtime); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same package written twice differs")
	}
	if got := members(t, a.Bytes()); strings.Join(got, ",") != "debian-binary,control.tar.gz,data.tar.gz" {
		t.Errorf("members %q", got)
	}
	if got := p.FileName(); got != "fleetcheck-node_1.2.0_amd64.deb" {
		t.Errorf("file name %q", got)
	}
	p.Version = "1:1.2.0"
	if got := p.FileName(); got != "fleetcheck-node_1.2.0_amd64.deb" {
		t.Errorf("file name with an epoch %q", got)
	}
}
