// Package spool keeps an agent's results on local disk until the coordinator
// acknowledges them, so a coordinator that is down for an hour, or an agent
// that restarts, loses nothing.
//
// Each entry is one file, written atomically (temporary file, fsync, rename,
// fsync of the directory) and named by a sequence number that fixes the
// delivery order across restarts. A file carries a checksum: one that does
// not verify is moved into corrupt/ with a log line rather than crashing the
// agent or being delivered. The spool is bounded by count and by bytes; when
// a new entry does not fit, the oldest entries are dropped and the drop is
// logged, because a node's newest results say the most about it. Every
// entry the spool loses (dropped for the limits, too large, not writable,
// corrupt) is reported once to the OnDrop callback, by reason, so that the
// agent can count what never reaches the coordinator.
package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
)

// Sentinel errors, tested with errors.Is.
var (
	// ErrNotFound: the entry is not (or no longer) in the spool: acknowledged
	// or dropped meanwhile.
	ErrNotFound = errors.New("spool: no such entry")
	// ErrCorrupt: the entry's file did not verify; it was moved aside.
	ErrCorrupt = errors.New("spool: corrupt entry")
	// ErrTooLarge: one entry is larger than the spool's byte limit.
	ErrTooLarge = errors.New("spool: entry larger than the spool")
	// ErrExists: an entry with this id is already spooled.
	ErrExists = errors.New("spool: entry exists")
	// ErrBadID: the id cannot name a file.
	ErrBadID = errors.New("spool: bad id")
)

// DropReason says why an entry was lost (the reason label of
// fleetcheck_agent_spool_dropped_total).
type DropReason string

// Why entries are lost.
const (
	// DropLimit: the oldest entries, dropped to keep within the limits.
	DropLimit DropReason = "limit"
	// DropTooLarge: one entry larger than the byte limit, never stored.
	DropTooLarge DropReason = "too_large"
	// DropNoSpace: the filesystem is full (ENOSPC) or the quota spent (EDQUOT).
	DropNoSpace DropReason = "no_space"
	// DropWriteError: any other failure to write the entry durably.
	DropWriteError DropReason = "write_error"
	// DropCorrupt: a spooled file that no longer verifies, moved aside, or
	// one that verifies but the agent cannot decode.
	DropCorrupt DropReason = "corrupt"
)

// DropReasons lists every reason, for metrics that start each at zero.
var DropReasons = []DropReason{DropLimit, DropTooLarge, DropNoSpace, DropWriteError, DropCorrupt}

// LossReason classifies an error from Put: what the lost entry counts as.
func LossReason(err error) DropReason {
	switch {
	case errors.Is(err, ErrTooLarge):
		return DropTooLarge
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return DropNoSpace
	default:
		return DropWriteError
	}
}

// FS is how the spool writes entry files: the operating system by default.
// It is a seam for tests, which pass one that fails as a full disk does.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
}

// File is an entry file being written.
type File interface {
	io.Writer
	Sync() error
	Close() error
}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	return os.OpenFile(name, flag, perm)
}
func (osFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }
func (osFS) Remove(name string) error             { return os.Remove(name) }

// Option adjusts a Spool at Open.
type Option func(*Spool)

// WithFS writes entry files through fs instead of the operating system.
func WithFS(fs FS) Option { return func(s *Spool) { s.fs = fs } }

// OnDrop calls f, once per change and never while blocking, with how many
// entries were lost and why. It runs with the spool locked: f must not call
// back into the spool.
func OnDrop(f func(reason DropReason, n int)) Option { return func(s *Spool) { s.onDrop = f } }

// Limits bound the spool. Zero means "no limit" for that dimension.
type Limits struct {
	MaxEntries int
	MaxBytes   int64
}

// Entry describes one spooled entry.
type Entry struct {
	ID   string
	Seq  uint64 // delivery order: larger is newer
	Size int64  // payload bytes
}

// Spool is a directory of entries. It is safe for concurrent use.
type Spool struct {
	dir    string
	lim    Limits
	log    zerolog.Logger
	fs     FS
	onDrop func(DropReason, int)

	mu      sync.Mutex
	entries []Entry // ascending Seq
	byID    map[string]int64
	bytes   int64
	nextSeq uint64
	changed chan struct{}
}

const (
	fileSuffix = ".entry"
	tmpSuffix  = ".tmp"
	corruptDir = "corrupt"
	headerLen  = 16 // magic(4) crc32c(4) length(8)
	maxIDLen   = 128
)

// magic starts every entry file: "fleetcheck spool, format 1".
const magic = "FCS1"

// checksum is CRC-32C (crc32 caches the table).
func checksum(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// Open loads the spool in dir, creating the directory when needed. Entries
// left by an earlier run are kept in their order; half-written temporary
// files are removed; entries that do not verify are moved aside.
func Open(dir string, lim Limits, log zerolog.Logger, opts ...Option) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: create %s: %w", dir, err)
	}
	s := &Spool{dir: dir, lim: lim, log: log, fs: osFS{}, onDrop: func(DropReason, int) {},
		byID: map[string]int64{}, nextSeq: 1, changed: make(chan struct{}, 1)}
	for _, o := range opts {
		o(s)
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: read %s: %w", dir, err)
	}
	for _, de := range des {
		name := de.Name()
		if de.IsDir() {
			continue
		}
		if strings.HasSuffix(name, tmpSuffix) {
			// A write the previous run did not finish: never acknowledged,
			// never complete, so nothing was lost that was promised.
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				log.Warn().Err(err).Str("file", name).Msg("spool: cannot remove unfinished write")
			}
			continue
		}
		if !strings.HasSuffix(name, fileSuffix) {
			continue
		}
		seq, id, ok := parseName(name)
		if !ok {
			s.moveAside(name, "unparsable file name")
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			s.moveAside(name, err.Error())
			s.onDrop(DropCorrupt, 1)
			continue
		}
		payload, err := decode(data)
		if err != nil {
			s.moveAside(name, err.Error())
			s.onDrop(DropCorrupt, 1)
			continue
		}
		if _, dup := s.byID[id]; dup {
			s.moveAside(name, "duplicate id")
			continue
		}
		s.entries = append(s.entries, Entry{ID: id, Seq: seq, Size: int64(len(payload))})
		s.byID[id] = int64(seq)
		s.bytes += int64(len(payload))
		if seq >= s.nextSeq {
			s.nextSeq = seq + 1
		}
	}
	sort.Slice(s.entries, func(i, j int) bool { return s.entries[i].Seq < s.entries[j].Seq })
	// Limits may have shrunk since the entries were written.
	if n := s.enforceLocked(); n > 0 {
		s.logDropped(n)
	}
	return s, nil
}

// Put stores data under id, durably, as the newest entry. It returns how
// many of the oldest entries were dropped to make room. An entry Put could
// not store (too large, not writable) is lost: OnDrop hears of it.
func (s *Spool) Put(id string, data []byte) (dropped int, err error) {
	if !validID(id) {
		return 0, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	if s.lim.MaxBytes > 0 && int64(len(data)) > s.lim.MaxBytes {
		s.onDrop(DropTooLarge, 1)
		return 0, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), s.lim.MaxBytes)
	}
	// Held across the write: sequence numbers must enter the index in
	// order, or a sender walking by sequence could skip one. Puts are rare
	// (one per inspection), so the lock costs nothing.
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; ok {
		return 0, fmt.Errorf("%w: %s", ErrExists, id)
	}
	seq := s.nextSeq
	if err := s.writeFile(fileName(seq, id), data); err != nil {
		s.onDrop(LossReason(err), 1)
		return 0, err
	}
	s.nextSeq++
	s.entries = append(s.entries, Entry{ID: id, Seq: seq, Size: int64(len(data))})
	s.byID[id] = int64(seq)
	s.bytes += int64(len(data))
	dropped = s.enforceLocked()
	if dropped > 0 {
		s.logDropped(dropped)
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return dropped, nil
}

func (s *Spool) writeFile(name string, data []byte) error {
	final := filepath.Join(s.dir, name)
	tmp := final + tmpSuffix
	f, err := s.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("spool: write: %w", err)
	}
	_, werr := f.Write(encode(data))
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = s.fs.Remove(tmp)
		return fmt.Errorf("spool: write: %w", werr)
	}
	if err := s.fs.Rename(tmp, final); err != nil {
		_ = s.fs.Remove(tmp)
		return fmt.Errorf("spool: write: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("spool: write: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// enforceLocked drops the oldest entries until the spool is within its
// limits, never the newest one.
func (s *Spool) enforceLocked() int {
	n := 0
	for len(s.entries) > 1 && s.overLocked() {
		e := s.entries[0]
		s.removeLocked(0)
		if err := os.Remove(filepath.Join(s.dir, fileName(e.Seq, e.ID))); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn().Err(err).Str("result_id", e.ID).Msg("spool: cannot remove dropped entry")
		}
		n++
	}
	if n > 0 {
		s.onDrop(DropLimit, n)
	}
	return n
}

func (s *Spool) overLocked() bool {
	return (s.lim.MaxEntries > 0 && len(s.entries) > s.lim.MaxEntries) ||
		(s.lim.MaxBytes > 0 && s.bytes > s.lim.MaxBytes)
}

func (s *Spool) logDropped(n int) {
	s.log.Warn().Int("dropped", n).Int("max_entries", s.lim.MaxEntries).Int64("max_bytes", s.lim.MaxBytes).
		Msgf("spool full: dropped %d oldest results", n)
}

func (s *Spool) removeLocked(i int) {
	e := s.entries[i]
	s.entries = append(s.entries[:i], s.entries[i+1:]...)
	delete(s.byID, e.ID)
	s.bytes -= e.Size
}

func (s *Spool) indexLocked(id string) int {
	seq, ok := s.byID[id]
	if !ok {
		return -1
	}
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].Seq >= uint64(seq) })
	if i < len(s.entries) && s.entries[i].ID == id {
		return i
	}
	return -1
}

// Get returns the payload of id. ErrNotFound when it was removed meanwhile;
// ErrCorrupt when its file no longer verifies (it is then moved aside).
func (s *Spool) Get(id string) ([]byte, error) {
	s.mu.Lock()
	i := s.indexLocked(id)
	if i < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	name := fileName(s.entries[i].Seq, id)
	s.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(s.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err == nil {
		var payload []byte
		if payload, err = decode(data); err == nil {
			return payload, nil
		}
	}
	s.mu.Lock()
	if i := s.indexLocked(id); i >= 0 {
		s.removeLocked(i)
		s.moveAside(name, err.Error())
		s.onDrop(DropCorrupt, 1)
	}
	s.mu.Unlock()
	return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, id, err)
}

// Remove deletes id (acknowledged). It reports whether the entry was there.
func (s *Spool) Remove(id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.indexLocked(id)
	if i < 0 {
		return false, nil
	}
	e := s.entries[i]
	s.removeLocked(i)
	// No directory fsync: a delete lost in a crash only means a resend,
	// which the coordinator answers as a duplicate.
	if err := os.Remove(filepath.Join(s.dir, fileName(e.Seq, e.ID))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("spool: remove %s: %w", id, err)
	}
	return true, nil
}

// Has reports whether id is spooled.
func (s *Spool) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byID[id]
	return ok
}

// After returns up to max entries with a sequence number above seq, oldest
// first (max <= 0: all of them). A sender keeps the last sequence it sent
// and walks on from there.
func (s *Spool) After(seq uint64, max int) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].Seq > seq })
	rest := s.entries[i:]
	if max > 0 && len(rest) > max {
		rest = rest[:max]
	}
	return append([]Entry(nil), rest...)
}

// Len is the number of entries.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Bytes is the payload size of all entries.
func (s *Spool) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Changed is signalled (without blocking, coalesced) after each Put.
func (s *Spool) Changed() <-chan struct{} { return s.changed }

// moveAside moves a file that cannot be trusted into corrupt/ so an
// operator can look at it; it never enters the index again.
func (s *Spool) moveAside(name, why string) {
	ev := s.log.Warn().Str("file", name).Str("reason", why)
	dst := filepath.Join(s.dir, corruptDir)
	err := os.MkdirAll(dst, 0o700)
	if err == nil {
		err = os.Rename(filepath.Join(s.dir, name), filepath.Join(dst, name))
	}
	if err != nil {
		// Cannot move it: remove it so it is not retried forever.
		ev = ev.AnErr("move_error", err)
		_ = os.Remove(filepath.Join(s.dir, name))
	}
	ev.Msg("spool: corrupt entry moved aside")
}

func fileName(seq uint64, id string) string {
	return fmt.Sprintf("%020d-%s%s", seq, id, fileSuffix)
}

func parseName(name string) (uint64, string, bool) {
	base := strings.TrimSuffix(name, fileSuffix)
	num, id, ok := strings.Cut(base, "-")
	if !ok || !validID(id) {
		return 0, "", false
	}
	seq, err := strconv.ParseUint(num, 10, 64)
	if err != nil || seq == 0 {
		return 0, "", false
	}
	return seq, id, true
}

// validID keeps ids usable as file names on any filesystem.
func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, r := range id {
		ok := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

func encode(payload []byte) []byte {
	out := make([]byte, headerLen+len(payload))
	copy(out, magic)
	binary.BigEndian.PutUint32(out[4:], checksum(payload))
	binary.BigEndian.PutUint64(out[8:], uint64(len(payload)))
	copy(out[headerLen:], payload)
	return out
}

func decode(data []byte) ([]byte, error) {
	if len(data) < headerLen {
		return nil, fmt.Errorf("short file: %d bytes", len(data))
	}
	if string(data[:4]) != magic {
		return nil, errors.New("bad magic")
	}
	n := binary.BigEndian.Uint64(data[8:])
	if n != uint64(len(data)-headerLen) {
		return nil, fmt.Errorf("length %d, header says %d", len(data)-headerLen, n)
	}
	payload := data[headerLen:]
	if checksum(payload) != binary.BigEndian.Uint32(data[4:]) {
		return nil, errors.New("checksum mismatch")
	}
	return payload, nil
}
