package bundle

import (
	"fmt"
	"path"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Limits bound what a bundle may hold, directory or packed alike
// (docs/bundles.md). A bundle past any of them is refused with ErrHostile
// before a probe reads it. A zero field takes DefaultLimits' value.
type Limits struct {
	// MaxTotalBytes bounds the sum of file sizes. A packed bundle's
	// decompressed stream may exceed it only by the tar headers' share
	// (MaxEntries × 1 KiB + 16 MiB): a gzip bomb is refused as soon as it
	// passes that, without holding what it unpacked.
	MaxTotalBytes int64
	// MaxFileBytes bounds any one file but the kernel log: every other
	// file is read whole by its parser.
	MaxFileBytes int64
	// MaxKernelLogBytes bounds dmesg.txt, which is parsed as a stream,
	// line by line, and never held whole.
	MaxKernelLogBytes int64
	// MaxEntries bounds files, directories and links together.
	MaxEntries int

	// holdFileBytes and holdTotalBytes override heldFileBytes and
	// heldTotalBytes: the tests and the fuzzer use small ones so that the
	// streaming path and the budget run on small inputs.
	holdFileBytes, holdTotalBytes int64
}

// DefaultLimits fit a real node's bundle (a kernel log of several boots,
// all of sysfs for the GPUs and HCAs) with room to spare, and keep the
// analysis of the largest accepted bundle under 300 MB of memory.
var DefaultLimits = Limits{
	MaxTotalBytes:     512 << 20,
	MaxFileBytes:      8 << 20,
	MaxKernelLogBytes: 256 << 20,
	MaxEntries:        200000,
}

// Small files (at most heldFileBytes) are held in memory when the bundle
// is opened; they may add up to heldTotalBytes. Large files are read from
// the disk or the archive when a probe asks, and a bundle may have at most
// maxLargeFiles of them: each read of one from a .tar.gz decompresses the
// archive up to it, so their count bounds the time a bundle can cost. A
// real bundle has one large file at most, the kernel log.
const (
	heldFileBytes  = 1 << 20
	heldTotalBytes = 64 << 20
	maxLargeFiles  = 16
)

// Names bound what a bundle's paths cost: a path's length and depth (a
// real bundle's longest is under 128 bytes and 10 deep), and the names of
// all its entries together, which the reader keeps.
const (
	maxNameBytes  = 1024
	maxNameDepth  = 32
	maxNamesBytes = 32 << 20
)

// checkName refuses a path past the name limits; names is the running
// total of the bundle's names so far.
func checkName(p string, names *int64) error {
	if len(p) > maxNameBytes {
		return fmt.Errorf("%w: a path of %d bytes (%.64q...), limit %d", ErrHostile, len(p), p, maxNameBytes)
	}
	if d := strings.Count(p, "/") + 1; d > maxNameDepth {
		return fmt.Errorf("%w: %.64q... is %d directories deep, limit %d", ErrHostile, p, d, maxNameDepth)
	}
	if *names += int64(len(p)); *names > maxNamesBytes {
		return fmt.Errorf("%w: the entries' names add up to more than %d bytes", ErrHostile, maxNamesBytes)
	}
	return nil
}

// holdFile is the size up to which a file is held in memory.
func (l Limits) holdFile() int64 {
	if l.holdFileBytes > 0 {
		return l.holdFileBytes
	}
	return heldFileBytes
}

func (l Limits) holdTotal() int64 {
	if l.holdTotalBytes > 0 {
		return l.holdTotalBytes
	}
	return heldTotalBytes
}

// holdBudget decides, file by file, whether a bundle holds a file in
// memory, and refuses a bundle whose small files would not fit or whose
// large files are too many.
type holdBudget struct {
	lim   Limits
	held  int64
	large int
}

func (b *holdBudget) admit(name string, size int64) (hold bool, err error) {
	if size <= b.lim.holdFile() {
		if b.held += size; b.held > b.lim.holdTotal() {
			return false, fmt.Errorf("%w: files of at most %d bytes add up to more than %d", ErrHostile, b.lim.holdFile(), b.lim.holdTotal())
		}
		return true, nil
	}
	if b.large++; b.large > maxLargeFiles {
		return false, fmt.Errorf("%w: more than %d files larger than %d bytes (%s is %d)", ErrHostile, maxLargeFiles, b.lim.holdFile(), name, size)
	}
	return false, nil
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = d.MaxTotalBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxKernelLogBytes <= 0 {
		l.MaxKernelLogBytes = d.MaxKernelLogBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	return l
}

// decompressedLimit bounds a packed bundle's decompressed stream: the
// files plus a tar header and padding (at most 1 KiB) per entry, plus
// room for long-name and PAX records.
func (l Limits) decompressedLimit() int64 {
	return l.MaxTotalBytes + int64(l.MaxEntries)<<10 + 16<<20
}

// fileLimit is the size limit of the file at a bundle path.
func (l Limits) fileLimit(name string) int64 {
	if isKernelLog(name) {
		return l.MaxKernelLogBytes
	}
	return l.MaxFileBytes
}

// isKernelLog reports whether a path names the kernel log: dmesg.txt at
// the bundle root, or under the one top-level directory a packed bundle
// may have.
func isKernelLog(name string) bool {
	name = path.Clean(name)
	if path.Base(name) != string(snapshot.SrcKernelLog) {
		return false
	}
	dir := path.Dir(name)
	return dir == "." || (!strings.Contains(dir, "/") && dir != "fs")
}
