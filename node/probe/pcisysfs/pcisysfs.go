// Package pcisysfs reads the NVIDIA and Mellanox functions on the PCI bus
// from /sys/bus/pci/devices under a configurable root. The bus is the ground
// truth for which GPUs and HCAs are installed: a GPU that fell off the bus
// often stays visible here while the driver no longer lists it.
package pcisysfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// DevicesDir is where PCI functions live, relative to the host's root.
const DevicesDir = "sys/bus/pci/devices"

// ErrNoPCI says the host has no /sys/bus/pci/devices (a bundle collected
// without it, or a machine without PCI).
var ErrNoPCI = errors.New("no /sys/bus/pci/devices")

// FileError is one attribute file that could not be read or parsed. Path is
// relative to DevicesDir ("0000:19:00.0/current_link_width").
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *FileError) Unwrap() error { return e.Err }

// maxValueSize bounds one attribute read: sysfs attributes are at most one page.
const maxValueSize = 4096

// Read returns the NVIDIA (0x10de) and Mellanox (0x15b3) functions under
// sys/bus/pci/devices of fsys, sorted by address.
//
// It returns (nil, ErrNoPCI) when the directory does not exist, and (nil,
// err) when it cannot be listed. Otherwise every function it could identify
// is returned, even when some files failed: err is then non-nil and joins
// one *FileError per file (find them with errors.As), and the fields those
// files would have filled stay zero, which the snapshot reads as unknown. A
// function whose vendor file cannot be read is left out (it cannot be told
// to be ours) and reported the same way. Missing link files are not errors:
// some functions have none.
func Read(fsys fs.FS) ([]snapshot.PCIDevice, error) {
	fi, err := fs.Stat(fsys, DevicesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoPCI
	}
	if err != nil {
		return nil, fmt.Errorf("stat /%s: %w", DevicesDir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("/%s is not a directory", DevicesDir)
	}
	entries, err := fs.ReadDir(fsys, DevicesDir)
	if err != nil {
		return nil, fmt.Errorf("read /%s: %w", DevicesDir, err)
	}
	r := &reader{fsys: fsys}
	devs := []snapshot.PCIDevice{}
	for _, e := range entries {
		if d, ok := r.device(e.Name()); ok {
			devs = append(devs, d)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Address < devs[j].Address })
	return devs, errors.Join(r.errs...)
}

type reader struct {
	fsys fs.FS
	errs []error
	buf  [maxValueSize + 1]byte
}

func (r *reader) note(addr, file string, err error) {
	r.errs = append(r.errs, &FileError{Path: addr + "/" + file, Err: unwrapPath(err)})
}

// value reads one attribute, trimmed; ok is false when it is missing or
// failed (failures other than a missing optional file are noted).
func (r *reader) value(addr, file string, optional bool) (string, bool) {
	b, err := readValue(r.fsys, path.Join(DevicesDir, addr, file), r.buf[:])
	if err != nil {
		if !optional || !errors.Is(err, fs.ErrNotExist) {
			r.note(addr, file, err)
		}
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

func (r *reader) device(addr string) (snapshot.PCIDevice, bool) {
	d := snapshot.PCIDevice{Address: addr}
	s, ok := r.value(addr, "vendor", false)
	if !ok {
		return d, false
	}
	v, err := parseHex(s, 16)
	if err != nil {
		r.note(addr, "vendor", err)
		return d, false
	}
	d.Vendor = uint16(v)
	if d.Vendor != snapshot.VendorNVIDIA && d.Vendor != snapshot.VendorMellanox {
		return d, false
	}
	if s, ok := r.value(addr, "device", false); ok {
		if v, err := parseHex(s, 16); err != nil {
			r.note(addr, "device", err)
		} else {
			d.Device = uint16(v)
		}
	}
	if s, ok := r.value(addr, "class", false); ok {
		if v, err := parseHex(s, 24); err != nil {
			r.note(addr, "class", err)
		} else {
			d.Class = uint32(v)
		}
	}
	d.CurrentLinkWidth = r.width(addr, "current_link_width")
	d.MaxLinkWidth = r.width(addr, "max_link_width")
	d.CurrentLinkSpeed = r.speed(addr, "current_link_speed")
	d.MaxLinkSpeed = r.speed(addr, "max_link_speed")
	drv, err := r.driver(addr)
	if err != nil {
		r.note(addr, "driver", err)
	}
	d.Driver = drv
	return d, true
}

func (r *reader) width(addr, file string) int {
	s, ok := r.value(addr, file, true)
	if !ok {
		return 0
	}
	w, err := parseWidth(s)
	if err != nil {
		r.note(addr, file, err)
	}
	return w
}

func (r *reader) speed(addr, file string) string {
	s, ok := r.value(addr, file, true)
	if !ok {
		return ""
	}
	if err := checkText(s); err != nil {
		r.note(addr, file, err)
		return ""
	}
	return s
}

// driver names the bound driver. Live sysfs has a symlink whose basename is
// the driver; a bundle may hold a plain file with the name, a copy of the
// driver directory (which names nothing), or nothing when no driver is bound.
func (r *reader) driver(addr string) (string, error) {
	p := path.Join(DevicesDir, addr, "driver")
	if target, err := fs.ReadLink(r.fsys, p); err == nil {
		return checkedName(path.Base(strings.TrimRight(target, "/")))
	}
	// Not a link, or fsys cannot read links: look at what is there.
	fi, err := fs.Stat(r.fsys, p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		return "", nil
	}
	b, err := readValue(r.fsys, p, r.buf[:])
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", nil
	}
	// A saved link target ("../../../bus/pci/drivers/nvidia") names the driver last.
	return checkedName(path.Base(s))
}

func checkedName(s string) (string, error) {
	if err := checkText(s); err != nil {
		return "", err
	}
	if strings.ContainsAny(s, " /") || s == "." || s == ".." {
		return "", fmt.Errorf("parse %q: not a driver name", clip(s))
	}
	return s, nil
}

// readValue reads a small attribute file into buf (maxValueSize+1 bytes),
// refusing anything larger than a page. The result aliases buf.
func readValue(fsys fs.FS, name string, buf []byte) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	n, err := io.ReadFull(f, buf)
	switch {
	case err == nil:
		return nil, fmt.Errorf("larger than %d bytes", len(buf)-1)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return buf[:n], nil
	default:
		return nil, err
	}
}

// unwrapPath drops *fs.PathError's full path: FileError names the file.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// parseHex parses "0x10de" (sysfs prints "0x%04x" / "0x%06x"); the prefix is
// optional, the value must fit in bits.
func parseHex(s string, bits int) (uint64, error) {
	t := strings.TrimSpace(s)
	h := strings.TrimPrefix(strings.TrimPrefix(t, "0x"), "0X")
	if h == "" || len(h) > bits/4 {
		return 0, fmt.Errorf("parse %q: want a %d-bit hex value", clip(t), bits)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return 0, fmt.Errorf("parse %q: want a %d-bit hex value", clip(t), bits)
		}
	}
	return strconv.ParseUint(h, 16, bits)
}

// parseWidth parses a link width ("16"); PCIe links are at most x32.
func parseWidth(s string) (int, error) {
	t := strings.TrimSpace(s)
	w, err := strconv.Atoi(t)
	if err != nil || w < 0 || w > 32 || t[0] == '+' {
		return 0, fmt.Errorf("parse %q: want a link width 0..32", clip(t))
	}
	return w, nil
}

// checkText accepts short printable ASCII: speeds and driver names end up
// in reports.
func checkText(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	if len(s) > 64 {
		return errors.New("value longer than 64 bytes")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("parse %q: not printable text", clip(s))
		}
	}
	return nil
}

func clip(s string) string {
	const n = 32
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
