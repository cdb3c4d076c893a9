package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fuzzLimits are FuzzUnpack's limits: small, with a hold size that sends
// anything past 64 bytes down the streaming path.
var fuzzLimits = Limits{MaxTotalBytes: 1 << 20, MaxFileBytes: 1 << 20, MaxKernelLogBytes: 1 << 20, MaxEntries: 1000, holdFileBytes: 64}

// hostileSeeds are the shapes FuzzUnpack's corpus starts from, each with
// the outcome Unpack must give under fuzzLimits.
var hostileSeeds = []struct {
	name string
	want error  // nil: accepted
	says string // what the refusal must say, when it matters
	hdrs []*tar.Header
	body map[string]string // regular files' bodies by name
}{
	// PAX records count no file bytes but decompress without end: refused
	// once the decompressed stream passes the limit.
	{name: "pax-header-bomb", want: ErrHostile, says: "decompresses past", hdrs: paxBomb(25, 900<<10)},
	{name: "fifo-entry", want: ErrHostile, hdrs: []*tar.Header{{Name: "dmesg.txt", Typeflag: tar.TypeFifo, Mode: 0o644}}},
	{name: "char-device-dev-zero", want: ErrHostile, hdrs: []*tar.Header{{Name: "dmesg.txt", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 5, Mode: 0o644}}},
	{name: "block-device", want: ErrHostile, hdrs: []*tar.Header{{Name: "fs/dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o644}}},
	{name: "hardlink-out", want: ErrHostile, hdrs: []*tar.Header{{Name: "nvidia-smi.xml", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}},
	{name: "symlink-out", want: ErrHostile, hdrs: []*tar.Header{{Name: "fs/proc", Typeflag: tar.TypeSymlink, Linkname: "/proc"}}},
	{name: "declared-size-past-limit", want: ErrHostile, hdrs: []*tar.Header{{Name: "dmesg.txt", Typeflag: tar.TypeReg, Size: 1 << 40, Mode: 0o644}}},
	{name: "total-past-limit", want: ErrHostile, hdrs: []*tar.Header{
		{Name: "a/dmesg.txt", Typeflag: tar.TypeReg, Size: 700 << 10, Mode: 0o644},
		{Name: "b/dmesg.txt", Typeflag: tar.TypeReg, Size: 700 << 10, Mode: 0o644}},
		body: map[string]string{"a/dmesg.txt": strings.Repeat("\x00", 700<<10), "b/dmesg.txt": strings.Repeat("\x00", 700<<10)}},
	{name: "dotdot", want: ErrHostile, hdrs: []*tar.Header{{Name: "n/../../etc/cron.d/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}}, body: map[string]string{"n/../../etc/cron.d/x": "x"}},
	{name: "file-and-dir", want: ErrHostile, hdrs: []*tar.Header{
		{Name: "fs/proc", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		{Name: "fs/proc/", Typeflag: tar.TypeDir, Mode: 0o755}}, body: map[string]string{"fs/proc": "x"}},
	{name: "huge-line-streamed", hdrs: []*tar.Header{
		{Name: "manifest.json", Typeflag: tar.TypeReg, Size: 12, Mode: 0o644},
		{Name: "dmesg.txt", Typeflag: tar.TypeReg, Size: 512 << 10, Mode: 0o644}},
		body: map[string]string{"manifest.json": `{"format":1}`, "dmesg.txt": "[1.0] NVRM: Xid (PCI:0000:17:00): 79, " + strings.Repeat("A", 512<<10-38)}},
}

func paxBomb(n, size int) []*tar.Header {
	pad := strings.Repeat("x", size)
	out := make([]*tar.Header, n)
	for i := range out {
		out[i] = &tar.Header{Name: fmt.Sprintf("d%d/", i), Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX, PAXRecords: map[string]string{"comment": pad}}
	}
	return out
}

func seedArchive(t *testing.T, hdrs []*tar.Header, body map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	for _, h := range hdrs {
		must(t, tw.WriteHeader(h))
		if b, ok := body[h.Name]; ok {
			if _, err := tw.Write([]byte(b)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A header that declares more than it holds ends the archive early: tar
	// refuses to close it, and the truncated stream is the seed.
	_ = tw.Close()
	must(t, gz.Close())
	return buf.Bytes()
}

// The corpus under testdata/fuzz/FuzzUnpack holds hostileSeeds; each gives
// its outcome. UPDATE_GOLDEN=1 writes the corpus again.
func TestHostileCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzUnpack")
	for _, s := range hostileSeeds {
		t.Run(s.name, func(t *testing.T) {
			p := filepath.Join(dir, s.name)
			if os.Getenv("UPDATE_GOLDEN") == "1" {
				data := seedArchive(t, s.hdrs, s.body)
				must(t, os.MkdirAll(dir, 0o755))
				must(t, os.WriteFile(p, []byte("go test fuzz v1\n[]byte("+strconv.Quote(string(data))+")\n"), 0o644))
			}
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("corpus seed missing (UPDATE_GOLDEN=1 writes it): %v", err)
			}
			lit, ok := strings.CutPrefix(strings.TrimSpace(string(raw)), "go test fuzz v1\n[]byte(")
			if !ok {
				t.Fatalf("%s is not a fuzz corpus file", p)
			}
			data, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
			if err != nil {
				t.Fatal(err)
			}
			m, err := unpackBytes([]byte(data), fuzzLimits)
			if s.want != nil {
				if !errors.Is(err, s.want) || !strings.Contains(err.Error(), s.says) {
					t.Fatalf("got %v, want %v saying %q", err, s.want, s.says)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			// Accepted: every file reads whole, the large ones streamed.
			err = fs.WalkDir(m, ".", func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					_, err = fs.ReadFile(m, p)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
