package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host/safefs"
)

type entry struct {
	name string
	typ  byte
	body string
	link string
}

func packTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Linkname: e.link}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestUnpackRefusesHostileArchives(t *testing.T) {
	t.Parallel()
	manifest := entry{name: "manifest.json", typ: tar.TypeReg, body: `{"format":1}`}
	cases := []struct {
		name    string
		entries []entry
		lim     Limits
	}{
		{"dotdot", []entry{manifest, {name: "../evil", typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"dotdot inside", []entry{{name: "b/fs/../../../etc/passwd", typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"absolute", []entry{{name: "/etc/cron.d/evil", typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"symlink out", []entry{manifest, {name: "fs/sys", typ: tar.TypeSymlink, link: "/sys"}}, DefaultLimits},
		{"hardlink", []entry{manifest, {name: "x", typ: tar.TypeLink, link: "/etc/shadow"}}, DefaultLimits},
		{"device", []entry{manifest, {name: "dev", typ: tar.TypeChar}}, DefaultLimits},
		{"fifo", []entry{manifest, {name: "p", typ: tar.TypeFifo}}, DefaultLimits},
		{"too big total", []entry{manifest, {name: "a", typ: tar.TypeReg, body: "0123456789"}, {name: "b", typ: tar.TypeReg, body: "0123456789"}},
			Limits{MaxTotalBytes: 25, MaxFileBytes: 100, MaxEntries: 10}},
		{"too big file", []entry{manifest, {name: "a", typ: tar.TypeReg, body: "0123456789"}},
			Limits{MaxTotalBytes: 1000, MaxFileBytes: 5, MaxEntries: 10}},
		{"too many entries", []entry{manifest, {name: "a", typ: tar.TypeDir}, {name: "b", typ: tar.TypeDir}},
			Limits{MaxTotalBytes: 1000, MaxFileBytes: 100, MaxEntries: 2}},
		{"backslash", []entry{{name: `..\evil`, typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"name too long", []entry{{name: strings.Repeat("a", maxNameBytes+1), typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"too deep", []entry{{name: strings.Repeat("a/", maxNameDepth) + "x", typ: tar.TypeReg, body: "x"}}, DefaultLimits},
		{"implied directories past the entries", []entry{{name: "a/b/c/d/e/x", typ: tar.TypeReg, body: "x"}},
			Limits{MaxEntries: 3}},
		// Each read of a large file decompresses the archive up to it: their
		// count is bounded, and so is what the small ones hold.
		{"too many large files", largeFiles(maxLargeFiles + 1), Limits{holdFileBytes: 4}},
		{"small files past what is held", []entry{manifest, {name: "a", typ: tar.TypeReg, body: "0123"}, {name: "b", typ: tar.TypeReg, body: "0123"}},
			Limits{holdFileBytes: 4, holdTotalBytes: 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := unpackBytes(packTar(t, tc.entries), tc.lim)
			if !errors.Is(err, ErrHostile) {
				t.Fatalf("Unpack: got %v, want ErrHostile", err)
			}
		})
	}
}

func largeFiles(n int) []entry {
	out := make([]entry, n)
	for i := range out {
		out[i] = entry{name: fmt.Sprintf("fs/f%d", i), typ: tar.TypeReg, body: "0123456789"}
	}
	return out
}

func TestUnpackNotGzip(t *testing.T) {
	t.Parallel()
	_, err := unpackBytes([]byte("plain text"), DefaultLimits)
	if !errors.Is(err, ErrFormat) {
		t.Fatalf("got %v, want ErrFormat", err)
	}
}

func TestTruncatedArchive(t *testing.T) {
	t.Parallel()
	data := packTar(t, []entry{{name: "manifest.json", typ: tar.TypeReg, body: `{"format":1}`}, {name: "dmesg.txt", typ: tar.TypeReg, body: string(bytes.Repeat([]byte("x"), 5000))}})
	_, err := unpackBytes(data[:len(data)/2], DefaultLimits)
	if err == nil {
		t.Fatal("truncated archive unpacked without error")
	}
}

func TestOneTopLevelDirectoryAccepted(t *testing.T) {
	t.Parallel()
	data := packTar(t, []entry{
		{name: "node1/", typ: tar.TypeDir},
		{name: "node1/manifest.json", typ: tar.TypeReg, body: `{"format":1,"hostname":"gpu-001","collected_at":"2026-11-28T02:00:00Z"}`},
		{name: "node1/dmesg.txt", typ: tar.TypeReg, body: "[1.0] hello\n"},
		{name: "node1/fs/proc/uptime", typ: tar.TypeReg, body: "100.0 50.0\n"},
	})
	m, err := unpackBytes(data, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromFS(m)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "gpu-001" {
		t.Errorf("Name = %q", b.Name())
	}
	if got := b.Now(); !got.Equal(time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)) {
		t.Errorf("Now = %v", got)
	}
	c := b.Capture(context.Background(), snapshot.SrcKernelLog)
	if c.State != snapshot.StateOK || string(c.Data) != "[1.0] hello\n" {
		t.Errorf("capture dmesg = %+v", c)
	}
	up, err := fs.ReadFile(b.FS(), "proc/uptime")
	if err != nil || string(up) != "100.0 50.0\n" {
		t.Errorf("fs proc/uptime = %q, %v", up, err)
	}
}

func TestCaptureFollowsManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := Create(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	must(t, w.WriteManifest(Manifest{Hostname: "gpu-002", CollectedAt: "2026-11-28T02:00:00Z", Sources: map[snapshot.Source]snapshot.SourceState{
		snapshot.SrcNvidiaSMI: {State: snapshot.StateTimeout, Error: "timed out after 30s"},
		snapshot.SrcKernelLog: {State: snapshot.StateOK},
	}}))
	must(t, w.AddFile("dmesg.txt", []byte("x\n")))
	must(t, w.Close())
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if c := b.Capture(ctx, snapshot.SrcNvidiaSMI); c.State != snapshot.StateTimeout || c.Err != "timed out after 30s" {
		t.Errorf("nvidia-smi: %+v, want the recorded timeout", c)
	}
	if c := b.Capture(ctx, snapshot.SrcKernelLog); c.State != snapshot.StateOK {
		t.Errorf("dmesg: %+v", c)
	}
	if c := b.Capture(ctx, snapshot.SrcAllReduce); c.State != snapshot.StateAbsent || c.Err == "" {
		t.Errorf("all_reduce: %+v, want absent with a reason", c)
	}
}

func TestWriterRoundTripPacked(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "gpu-003-20261128.tar.gz")
	w, err := Create(p, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	must(t, w.WriteManifest(Manifest{Hostname: "gpu-003"}))
	must(t, w.AddFile("fs/sys/class/infiniband/mlx5_0/ports/1/state", []byte("4: ACTIVE\n")))
	must(t, w.Close())
	if _, err := Create(p, time.Now()); err == nil {
		t.Error("Create overwrote an existing archive")
	}
	b, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fs.ReadFile(b.FS(), "sys/class/infiniband/mlx5_0/ports/1/state")
	if err != nil || string(got) != "4: ACTIVE\n" {
		t.Fatalf("state = %q, %v", got, err)
	}
	entries, err := fs.ReadDir(b.FS(), "sys/class/infiniband")
	if err != nil || len(entries) != 1 || entries[0].Name() != "mlx5_0" || !entries[0].IsDir() {
		t.Fatalf("ReadDir = %v, %v", entries, err)
	}
}

func TestBadManifest(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"garbage":  "{not json",
		"future":   `{"format": 2}`,
		"bad time": `{"format": 1, "collected_at": "yesterday"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, ManifestFile), []byte(body), 0o644))
			if _, err := Open(dir); !errors.Is(err, ErrFormat) {
				t.Fatalf("got %v, want ErrFormat", err)
			}
		})
	}
}

func unpackBytes(data []byte, lim Limits) (fs.FS, error) {
	return Unpack(bytes.NewReader(data), int64(len(data)), lim)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzUnpack's corpus (testdata/fuzz/FuzzUnpack) holds the hostile shapes:
// PAX-header bombs, pipe and device entries, sparse and lying headers,
// overlong lines. A small hold size makes the fuzzer run the streaming path.
func FuzzUnpack(f *testing.F) {
	f.Add([]byte{})
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	_ = tw.WriteHeader(&tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Size: 12, Mode: 0o644})
	_, _ = tw.Write([]byte(`{"format":1}`))
	_ = tw.Close()
	_ = gz.Close()
	f.Add(buf.Bytes())
	lim := fuzzLimits
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := unpackBytes(data, lim)
		if err != nil {
			return
		}
		_ = fs.WalkDir(m, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !fs.ValidPath(p) {
				t.Fatalf("unpacked invalid path %q", p)
			}
			if d.IsDir() {
				return nil
			}
			got, err := fs.ReadFile(m, p)
			if err != nil {
				t.Fatalf("%s was accepted but does not read: %v", p, err)
			}
			if fi, _ := d.Info(); int64(len(got)) != fi.Size() || fi.Size() > lim.MaxFileBytes {
				t.Fatalf("%s: read %d bytes, listed %d, limit %d", p, len(got), fi.Size(), lim.MaxFileBytes)
			}
			return nil
		})
	})
}

// A packed bundle's large files stay in the archive: the kernel log comes
// as a stream, reads the same, and a bundle of zeros does not fill memory.
func TestPackedLargeFileIsStreamed(t *testing.T) {
	t.Parallel()
	dmesg := strings.Repeat("[    1.0] NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n", 200)
	data := packTar(t, []entry{
		{name: "n/", typ: tar.TypeDir},
		{name: "n/manifest.json", typ: tar.TypeReg, body: `{"format":1,"hostname":"gpu-009"}`},
		{name: "n/dmesg.txt", typ: tar.TypeReg, body: dmesg},
		{name: "n/fs/proc/uptime", typ: tar.TypeReg, body: "100.0 50.0\n"},
	})
	m, err := unpackBytes(data, Limits{holdFileBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	mfs := m.(*memFS)
	if _, held := mfs.files["n/dmesg.txt"]; held {
		t.Error("dmesg.txt was held")
	}
	if _, ok := mfs.streamed["n/dmesg.txt"]; !ok {
		t.Fatal("dmesg.txt is not left in the archive")
	}
	b, err := FromFS(m)
	if err != nil {
		t.Fatal(err)
	}
	rc, c := b.CaptureStream(context.Background(), snapshot.SrcKernelLog)
	if rc == nil || c.State != snapshot.StateOK {
		t.Fatalf("CaptureStream: %+v", c)
	}
	got, err := io.ReadAll(rc)
	must(t, rc.Close())
	if err != nil || string(got) != dmesg {
		t.Errorf("streamed %d bytes (%v), want %d", len(got), err, len(dmesg))
	}
	if c := b.Capture(context.Background(), snapshot.SrcKernelLog); string(c.Data) != dmesg {
		t.Errorf("Capture read %d bytes, want %d", len(c.Data), len(dmesg))
	}
	entries, err := fs.ReadDir(m, "n")
	if err != nil || len(entries) != 3 {
		t.Errorf("listing %v, %v", entries, err)
	}
	if fi, err := fs.Stat(m, "n/dmesg.txt"); err != nil || fi.Size() != int64(len(dmesg)) {
		t.Errorf("stat %v, %v", fi, err)
	}
}

// The kernel log has its own, larger limit; every other file the smaller.
func TestUnpackPerFileLimits(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("x", 2000)
	lim := Limits{MaxFileBytes: 1000, MaxKernelLogBytes: 4000}
	if _, err := unpackBytes(packTar(t, []entry{{name: "n/dmesg.txt", typ: tar.TypeReg, body: body}}), lim); err != nil {
		t.Errorf("a kernel log under its limit: %v", err)
	}
	for _, name := range []string{"nvidia-smi.xml", "n/fs/dmesg.txt", "n/fs/x/dmesg.txt"} {
		_, err := unpackBytes(packTar(t, []entry{{name: name, typ: tar.TypeReg, body: body}}), lim)
		if !errors.Is(err, ErrHostile) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s past the file limit: got %v, want ErrHostile naming it", name, err)
		}
	}
}

// The bundle path itself must be a directory or a regular file: a pipe
// given to analyze is refused, not waited on.
func TestOpenRefusesPipeAsBundle(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "bundle.tar.gz")
	must(t, syscall.Mkfifo(p, 0o644))
	if _, err := Open(p); !errors.Is(err, ErrHostile) {
		t.Fatalf("got %v, want ErrHostile", err)
	}
}

// A directory bundle's symlinks may not lead out of it (the bundle is
// refused, naming the link); inside, they work.
func TestDirectoryBundleLinksStayInside(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "secret")
	must(t, os.WriteFile(outside, []byte("root:x:0:0"), 0o600))

	out := t.TempDir()
	must(t, os.Symlink(outside, filepath.Join(out, string(snapshot.SrcNvidiaSMI))))
	_, err := Open(out)
	if !errors.Is(err, ErrHostile) || !strings.Contains(err.Error(), string(snapshot.SrcNvidiaSMI)) {
		t.Errorf("a link out of the bundle: got %v, want ErrHostile naming %s", err, snapshot.SrcNvidiaSMI)
	}

	in := t.TempDir()
	must(t, os.WriteFile(filepath.Join(in, "real-dmesg.txt"), []byte("[    1.0] hello\n"), 0o600))
	must(t, os.Symlink("real-dmesg.txt", filepath.Join(in, string(snapshot.SrcKernelLog))))
	b, err := Open(in)
	if err != nil {
		t.Fatal(err)
	}
	if c := b.Capture(context.Background(), snapshot.SrcKernelLog); c.State != snapshot.StateOK || !strings.Contains(string(c.Data), "hello") {
		t.Errorf("a link inside the bundle: state %s err %q", c.State, c.Err)
	}
}

// A directory bundle follows the packed bundle's rules: a pipe, a device,
// a file past its limit or a link out refuses the whole bundle, with the
// file named, and nothing hangs or reads without bound.
func TestDirectoryBundleRefusesHostileFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		make  func(t *testing.T, dir string)
		file  string
		lim   Limits
		wants string
	}{
		{"fifo dmesg", func(t *testing.T, dir string) {
			must(t, syscall.Mkfifo(filepath.Join(dir, "dmesg.txt"), 0o644))
		}, "dmesg.txt", DefaultLimits, "named pipe"},
		{"fifo deep in fs", func(t *testing.T, dir string) {
			must(t, os.MkdirAll(filepath.Join(dir, "fs/proc"), 0o755))
			must(t, syscall.Mkfifo(filepath.Join(dir, "fs/proc/uptime"), 0o644))
		}, "fs/proc/uptime", DefaultLimits, "named pipe"},
		{"sparse dmesg past the limit", func(t *testing.T, dir string) {
			// 2 GiB that use no disk: the size alone refuses it.
			f, err := os.Create(filepath.Join(dir, "dmesg.txt"))
			must(t, err)
			must(t, f.Truncate(2<<30))
			must(t, f.Close())
		}, "dmesg.txt", DefaultLimits, "limit"},
		{"other file past its limit", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "nvidia-smi.xml"), bytes.Repeat([]byte("x"), 2048), 0o644))
		}, "nvidia-smi.xml", Limits{MaxFileBytes: 1024}, "limit"},
		{"total past the limit", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "a"), bytes.Repeat([]byte("x"), 600), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "b"), bytes.Repeat([]byte("x"), 600), 0o644))
		}, "", Limits{MaxTotalBytes: 1000}, "more than 1000 bytes"},
		{"too many entries", func(t *testing.T, dir string) {
			for _, n := range []string{"a", "b", "c"} {
				must(t, os.WriteFile(filepath.Join(dir, n), nil, 0o644))
			}
		}, "", Limits{MaxEntries: 2}, "more than 2 entries"},
		{"too many large files", func(t *testing.T, dir string) {
			for i := range maxLargeFiles + 1 {
				must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte("0123456789"), 0o644))
			}
		}, "", Limits{holdFileBytes: 4}, "more than 16 files larger than 4 bytes"},
		{"small files past what is held", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "a"), []byte("0123"), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "b"), []byte("0123"), 0o644))
		}, "", Limits{holdFileBytes: 4, holdTotalBytes: 6}, "add up to more than 6"},
		{"too deep", func(t *testing.T, dir string) {
			must(t, os.MkdirAll(filepath.Join(dir, strings.Repeat("a/", maxNameDepth+1)), 0o755))
		}, "", DefaultLimits, "directories deep"},
		{"symlink out", func(t *testing.T, dir string) {
			must(t, os.MkdirAll(filepath.Join(dir, "fs"), 0o755))
			must(t, os.Symlink("/proc", filepath.Join(dir, "fs/proc")))
		}, "fs/proc", DefaultLimits, "leads out"},
		{"symlink climbing out", func(t *testing.T, dir string) {
			must(t, os.Symlink("../../../../../../../../etc/passwd", filepath.Join(dir, "versions.json")))
		}, "versions.json", DefaultLimits, "leads out"},
		{"symlink to a fifo inside", func(t *testing.T, dir string) {
			must(t, os.MkdirAll(filepath.Join(dir, "x"), 0o755))
			must(t, syscall.Mkfifo(filepath.Join(dir, "x/p"), 0o644))
			must(t, os.Symlink("x/p", filepath.Join(dir, "dmesg.txt")))
		}, "dmesg.txt", DefaultLimits, "named pipe"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, ManifestFile), []byte(`{"format":1}`), 0o644))
			tc.make(t, dir)
			_, err := OpenWithLimits(dir, tc.lim)
			if !errors.Is(err, ErrHostile) {
				t.Fatalf("got %v, want ErrHostile", err)
			}
			if tc.file != "" && !strings.Contains(err.Error(), tc.file) {
				t.Errorf("%q does not name %s", err, tc.file)
			}
			if !strings.Contains(err.Error(), tc.wants) {
				t.Errorf("%q does not say %q", err, tc.wants)
			}
		})
	}
}

// A device node in a directory bundle (`tar xf` as root recreates them):
// /dev/zero's twin must refuse the bundle, not fill memory.
func TestDirectoryBundleRefusesDeviceNode(t *testing.T) {
	t.Parallel()
	// .ci/run installs packages with apt-get: CI runs as root.
	needs.Root(t, "creating a device node")
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, ManifestFile), []byte(`{"format":1}`), 0o644))
	// mknod c 1 5: /dev/zero.
	if err := syscall.Mknod(filepath.Join(dir, "dmesg.txt"), syscall.S_IFCHR|0o644, 1<<8|5); err != nil {
		needs.Skip(t, "mknod not permitted here (%v): a sandbox without CAP_MKNOD", err)
	}
	_, err := Open(dir)
	if !errors.Is(err, ErrHostile) || !strings.Contains(err.Error(), "dmesg.txt") || !strings.Contains(err.Error(), "character device") {
		t.Fatalf("got %v, want ErrHostile naming dmesg.txt as a character device", err)
	}
}

// A file swapped for a pipe after the bundle was opened is refused when
// read, without blocking; one that grew past its limit stops at it.
func TestDirectoryBundleSwappedAfterOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	big := bytes.Repeat([]byte("[    1.0] hello\n"), (heldFileBytes/16)+100) // not held: read when asked
	must(t, os.WriteFile(filepath.Join(dir, "dmesg.txt"), big, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "nvidia-smi.xml"), big, 0o644))
	d, err := openDir(dir, Limits{MaxFileBytes: int64(len(big)) + 10})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Remove(filepath.Join(dir, "dmesg.txt")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "dmesg.txt"), 0o644))
	if _, err := fs.ReadFile(d, "dmesg.txt"); !errors.Is(err, ErrHostile) || !errors.Is(err, safefs.ErrNotRegular) {
		t.Errorf("pipe swapped in: got %v, want ErrHostile / ErrNotRegular", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "nvidia-smi.xml"), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.Write(bytes.Repeat([]byte("y"), 100))
	must(t, err)
	must(t, f.Close())
	if _, err := fs.ReadFile(d, "nvidia-smi.xml"); !errors.Is(err, safefs.ErrTooLarge) {
		t.Errorf("file grown past its limit: got %v, want ErrTooLarge", err)
	}
}

// A directory bundle reads its small files ahead; the large ones and
// links are read when asked, and read the same.
func TestDirectoryBundleReadAhead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	big := bytes.Repeat([]byte("[    1.0] NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n"), 16000) // ~1.1 MB: not held
	must(t, os.MkdirAll(filepath.Join(dir, "fs/sys/bus/pci/drivers/nvidia"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "fs/sys/bus/pci/devices/0000:17:00.0"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "dmesg.txt"), big, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "fs/sys/bus/pci/devices/0000:17:00.0/current_link_width"), []byte("16\n"), 0o600))
	must(t, os.Symlink("../../drivers/nvidia", filepath.Join(dir, "fs/sys/bus/pci/devices/0000:17:00.0/driver")))

	d, err := openDir(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if _, held := d.files["dmesg.txt"]; held {
		t.Errorf("a %d-byte file was held", len(big))
	}
	if got, err := fs.ReadFile(d, "dmesg.txt"); err != nil || !bytes.Equal(got, big) {
		t.Errorf("big file: %d bytes, %v", len(got), err)
	}
	if got, err := fs.ReadFile(d, "fs/sys/bus/pci/devices/0000:17:00.0/current_link_width"); err != nil || string(got) != "16\n" {
		t.Errorf("small file %q, %v", got, err)
	}
	if target, err := fs.ReadLink(d, "fs/sys/bus/pci/devices/0000:17:00.0/driver"); err != nil || path.Base(target) != "nvidia" {
		t.Errorf("link %q, %v", target, err)
	}
	entries, err := fs.ReadDir(d, "fs/sys/bus/pci/devices/0000:17:00.0")
	if err != nil || len(entries) != 2 || entries[1].Name() != "driver" || entries[1].Type()&fs.ModeSymlink == 0 {
		t.Errorf("listing %v, %v", entries, err)
	}
	if fi, err := fs.Stat(d, "fs/sys/bus/pci/devices/0000:17:00.0/driver"); err != nil || !fi.IsDir() {
		t.Errorf("stat through a link inside: %v, %v", fi, err)
	}
}
