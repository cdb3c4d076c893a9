package spool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// logBuf collects log output; zerolog writes from several goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func open(t *testing.T, dir string, lim Limits) (*Spool, *logBuf) {
	t.Helper()
	var lb logBuf
	s, err := Open(dir, lim, zerolog.New(&lb))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s, &lb
}

func ids(s *Spool) []string {
	var out []string
	for _, e := range s.After(0, 0) {
		out = append(out, e.ID)
	}
	return out
}

func put(t *testing.T, s *Spool, id string) {
	t.Helper()
	if _, err := s.Put(id, []byte("payload of "+id)); err != nil {
		t.Fatalf("put %s: %v", id, err)
	}
}

func TestRestartKeepsUnacked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, Limits{})
	for i := range 5 {
		put(t, s, fmt.Sprintf("r%d", i))
	}
	if ok, err := s.Remove("r1"); !ok || err != nil {
		t.Fatalf("remove r1: %v %v", ok, err)
	}

	// A second process opening the same directory: what the first did not
	// see acknowledged is there, in the same order.
	s2, _ := open(t, dir, Limits{})
	if got, want := strings.Join(ids(s2), ","), "r0,r2,r3,r4"; got != want {
		t.Fatalf("after restart: %s, want %s", got, want)
	}
	data, err := s2.Get("r3")
	if err != nil || string(data) != "payload of r3" {
		t.Fatalf("get r3: %q %v", data, err)
	}
	// New entries go after the old ones.
	put(t, s2, "r5")
	if got := ids(s2); got[len(got)-1] != "r5" {
		t.Fatalf("new entry not last: %v", got)
	}
	if s2.Len() != 5 {
		t.Fatalf("len %d", s2.Len())
	}
}

func TestAckRemoves(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, Limits{})
	put(t, s, "a")
	put(t, s, "b")
	if ok, err := s.Remove("a"); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	if ok, _ := s.Remove("a"); ok {
		t.Fatal("second remove found the entry")
	}
	if _, err := s.Get("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get removed: %v", err)
	}
	if s.Has("a") || !s.Has("b") {
		t.Fatal("Has disagrees")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"+fileSuffix))
	if len(files) != 1 {
		t.Fatalf("files on disk: %v", files)
	}
	if s.Bytes() != int64(len("payload of b")) {
		t.Fatalf("bytes %d", s.Bytes())
	}
}

func TestBoundDropsOldest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		lim  Limits
		want string
	}{
		{"by count", Limits{MaxEntries: 3}, "r3,r4,r5"},
		// each payload is 12 bytes: 40 bytes hold 3.
		{"by bytes", Limits{MaxBytes: 40}, "r3,r4,r5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s, lb := open(t, dir, tc.lim)
			total := 0
			for i := range 6 {
				n, err := s.Put(fmt.Sprintf("r%d", i), []byte(fmt.Sprintf("payload-%04d", i)))
				if err != nil {
					t.Fatal(err)
				}
				total += n
			}
			if got := strings.Join(ids(s), ","); got != tc.want {
				t.Fatalf("kept %s, want %s", got, tc.want)
			}
			if total != 3 {
				t.Fatalf("dropped %d, want 3", total)
			}
			if !strings.Contains(lb.String(), "spool full: dropped 1 oldest results") {
				t.Fatalf("no drop warning in log: %s", lb.String())
			}
			files, _ := filepath.Glob(filepath.Join(dir, "*"+fileSuffix))
			if len(files) != 3 {
				t.Fatalf("files on disk: %v", files)
			}
		})
	}
}

func TestShrunkLimitsOnOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, Limits{})
	for i := range 5 {
		put(t, s, fmt.Sprintf("r%d", i))
	}
	s2, lb := open(t, dir, Limits{MaxEntries: 2})
	if got := strings.Join(ids(s2), ","); got != "r3,r4" {
		t.Fatalf("kept %s", got)
	}
	if !strings.Contains(lb.String(), "spool full: dropped 3 oldest results") {
		t.Fatalf("log: %s", lb.String())
	}
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	s, _ := open(t, t.TempDir(), Limits{MaxBytes: 4})
	if _, err := s.Put("big", []byte("12345")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v", err)
	}
}

func TestPutRejects(t *testing.T) {
	t.Parallel()
	s, _ := open(t, t.TempDir(), Limits{})
	put(t, s, "a")
	if _, err := s.Put("a", nil); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	for _, id := range []string{"", "../x", "a/b", "a.b", strings.Repeat("x", 200)} {
		if _, err := s.Put(id, nil); !errors.Is(err, ErrBadID) {
			t.Fatalf("id %q: %v", id, err)
		}
	}
}

func TestCorruptEntrySkipped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := open(t, dir, Limits{})
	for _, id := range []string{"a", "b", "c", "d"} {
		put(t, s, id)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"+fileSuffix))
	if len(files) != 4 {
		t.Fatalf("files %v", files)
	}
	// b: flipped payload byte; c: truncated; plus junk that only looks like an entry,
	// and a half-written temporary file.
	data, _ := os.ReadFile(files[1])
	data[len(data)-1] ^= 0xff
	must(t, os.WriteFile(files[1], data, 0o600))
	must(t, os.WriteFile(files[2], []byte("FCS"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "garbage"+fileSuffix), []byte("x"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, fileName(99, "z")+tmpSuffix), []byte("half"), 0o600))

	s2, lb := open(t, dir, Limits{})
	if got := strings.Join(ids(s2), ","); got != "a,d" {
		t.Fatalf("kept %s", got)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, corruptDir, "*"))
	if len(moved) != 3 {
		t.Fatalf("moved aside: %v", moved)
	}
	if n := strings.Count(lb.String(), "corrupt entry moved aside"); n != 3 {
		t.Fatalf("%d corrupt log lines: %s", n, lb.String())
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*"+tmpSuffix)); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}

	// Corruption after load is found on Get, moved aside, not fatal.
	files, _ = filepath.Glob(filepath.Join(dir, "*"+fileSuffix))
	must(t, os.WriteFile(files[0], []byte("nonsense-nonsense-nonsense"), 0o600))
	if _, err := s2.Get("a"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("get corrupt: %v", err)
	}
	if s2.Has("a") || s2.Len() != 1 {
		t.Fatalf("corrupt entry still indexed: %v", ids(s2))
	}
}

func TestAfterWalksInOrder(t *testing.T) {
	t.Parallel()
	s, _ := open(t, t.TempDir(), Limits{})
	for i := range 10 {
		put(t, s, fmt.Sprintf("r%d", i))
	}
	var seen []string
	var cursor uint64
	for {
		batch := s.After(cursor, 3)
		if len(batch) == 0 {
			break
		}
		for _, e := range batch {
			seen = append(seen, e.ID)
			cursor = e.Seq
		}
	}
	if len(seen) != 10 || seen[0] != "r0" || seen[9] != "r9" {
		t.Fatalf("walk: %v", seen)
	}
	select {
	case <-s.Changed():
	default:
		t.Fatal("Changed not signalled after Put")
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	s, _ := open(t, t.TempDir(), Limits{MaxEntries: 50})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := s.Put(id, []byte(id)); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					if _, err := s.Remove(id); err != nil {
						t.Error(err)
					}
				}
				s.After(0, 5)
			}
		}()
	}
	wg.Wait()
	if s.Len() != 48 {
		t.Fatalf("len %d, want 48", s.Len())
	}
	var prev uint64
	for _, e := range s.After(0, 0) {
		if e.Seq <= prev {
			t.Fatalf("out of order: %d after %d", e.Seq, prev)
		}
		prev = e.Seq
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// failingFS writes through the operating system until the budget of bytes
// is spent, then fails each write with err, as a filesystem that fills up
// does (ENOSPC) or a failing disk (EIO).
type failingFS struct {
	mu     sync.Mutex
	budget int
	err    error
}

func (f *failingFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &failingFile{File: file, fs: f}, nil
}
func (f *failingFS) Rename(o, n string) error { return os.Rename(o, n) }
func (f *failingFS) Remove(name string) error { return os.Remove(name) }

type failingFile struct {
	*os.File
	fs *failingFS
}

func (f *failingFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if len(b) > f.fs.budget {
		return 0, &os.PathError{Op: "write", Path: f.Name(), Err: f.fs.err}
	}
	f.fs.budget -= len(b)
	return f.File.Write(b)
}

// drops records OnDrop's reports.
type drops struct {
	mu sync.Mutex
	n  map[DropReason]int
}

func (d *drops) record(r DropReason, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[DropReason]int{}
	}
	d.n[r] += n
}

func (d *drops) get(r DropReason) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[r]
}

// Every entry the spool loses is reported once, with its reason: a full
// disk (the entries that did not fit), a failing one, the limits, one
// entry too large, a corrupt file.
func TestLossesReportedByReason(t *testing.T) {
	t.Parallel()
	entry := len(encode([]byte("payload of r0")))
	tests := []struct {
		name   string
		lim    Limits
		err    error
		budget int // bytes the filesystem takes before failing
		puts   int
		want   map[DropReason]int
		kept   int
	}{
		{"disk full", Limits{}, syscall.ENOSPC, 3 * entry, 10, map[DropReason]int{DropNoSpace: 7}, 3},
		{"quota spent", Limits{}, syscall.EDQUOT, 0, 4, map[DropReason]int{DropNoSpace: 4}, 0},
		{"disk failing", Limits{}, syscall.EIO, entry, 5, map[DropReason]int{DropWriteError: 4}, 1},
		{"limits", Limits{MaxEntries: 2}, nil, 1 << 20, 6, map[DropReason]int{DropLimit: 4}, 2},
		{"full disk and limits", Limits{MaxEntries: 2}, syscall.ENOSPC, 4 * entry, 8, map[DropReason]int{DropLimit: 2, DropNoSpace: 4}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var d drops
			s, err := Open(t.TempDir(), tc.lim, zerolog.Nop(), WithFS(&failingFS{budget: tc.budget, err: tc.err}), OnDrop(d.record))
			if err != nil {
				t.Fatal(err)
			}
			failed := 0
			for i := range tc.puts {
				if _, err := s.Put(fmt.Sprintf("r%d", i), []byte(fmt.Sprintf("payload of r%d", i))); err != nil {
					failed++
					if tc.err != nil && !errors.Is(err, tc.err) {
						t.Errorf("put r%d: %v, want %v", i, err, tc.err)
					}
				}
			}
			for _, r := range DropReasons {
				if got := d.get(r); got != tc.want[r] {
					t.Errorf("%s: %d reported, want %d", r, got, tc.want[r])
				}
			}
			if got := tc.want[DropNoSpace] + tc.want[DropWriteError]; failed != got {
				t.Errorf("%d puts failed, %d reported lost to the disk", failed, got)
			}
			if s.Len() != tc.kept {
				t.Errorf("%d kept, want %d", s.Len(), tc.kept)
			}
		})
	}
}

func TestTooLargeAndCorruptReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var d drops
	s, err := Open(dir, Limits{MaxBytes: 64}, zerolog.Nop(), OnDrop(d.record))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put("big", make([]byte, 65)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big: %v", err)
	}
	put(t, s, "a")
	put(t, s, "b")
	files, _ := filepath.Glob(filepath.Join(dir, "*"+fileSuffix))
	if err := os.WriteFile(files[0], []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("a"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("get a: %v", err)
	}
	// And at the next start, a file that no longer verifies.
	if err := os.WriteFile(files[1], []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Limits{}, zerolog.Nop(), OnDrop(d.record)); err != nil {
		t.Fatal(err)
	}
	if d.get(DropTooLarge) != 1 || d.get(DropCorrupt) != 2 {
		t.Errorf("too_large %d, corrupt %d; want 1 and 2", d.get(DropTooLarge), d.get(DropCorrupt))
	}
}

func TestLossReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want DropReason
	}{
		{fmt.Errorf("spool: write: %w", &os.PathError{Op: "write", Err: syscall.ENOSPC}), DropNoSpace},
		{fmt.Errorf("spool: write: %w", syscall.EDQUOT), DropNoSpace},
		{fmt.Errorf("spool: write: %w", syscall.EIO), DropWriteError},
		{fmt.Errorf("%w: 5 bytes", ErrTooLarge), DropTooLarge},
	} {
		if got := LossReason(tc.err); got != tc.want {
			t.Errorf("LossReason(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
