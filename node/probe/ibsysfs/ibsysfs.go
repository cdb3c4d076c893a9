// Package ibsysfs reads RDMA adapters (InfiniBand and RoCE HCAs) and their
// ports from /sys/class/infiniband under a configurable root.
//
// The tree is read file by file so that one unreadable or garbage file costs
// that value only: the file is named in HCA.Errors and every other value of
// the device is still returned. A node without the directory has no RDMA
// hardware (or no driver loaded), which is no data, not a fault: Read then
// returns ErrNoInfiniBand.
//
// Counter values are kept as the kernel prints them. In particular
// counters/port_rcv_data and counters/port_xmit_data count 4-byte words:
// consumers multiply by 4 to get bytes.
package ibsysfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// ClassDir is where the adapters live, relative to the host's root.
const ClassDir = "sys/class/infiniband"

// ErrNoInfiniBand says the host has no /sys/class/infiniband: no RDMA
// adapters, or no RDMA driver loaded.
var ErrNoInfiniBand = errors.New("no /sys/class/infiniband")

// maxValueSize bounds one attribute read: sysfs attributes are at most one
// page, and a hostile bundle must not make us read a huge file.
const maxValueSize = 4096

// Read returns the adapters under sys/class/infiniband of fsys (a tree rooted
// at the host's "/"), sorted by name in natural order (mlx5_2 before mlx5_10),
// each with its ports sorted by number.
//
// It returns (nil, ErrNoInfiniBand) when the directory does not exist, and
// another error only when the directory itself cannot be listed. Problems
// with single files are recorded in the owning HCA's Errors as
// "<dev>/<relative path>: <reason>" and do not stop the walk. Two kinds of
// file are skipped without a note, because they are not faults:
//   - hw_counters files whose read fails with EINVAL (ConnectX-7 firmware
//     refuses some of them and logs ACCESS_REG errors), and
//   - counter files that read "N/A ..." (ports without a PMA).
//
// Missing hca_type, fw_ver or board_id files leave the field empty (not every
// driver has them); missing ports/, state, phys_state, rate or link_layer are
// recorded, since a port cannot be judged without them.
func Read(fsys fs.FS) ([]snapshot.HCA, error) {
	fi, err := fs.Stat(fsys, ClassDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoInfiniBand
	}
	if err != nil {
		return nil, fmt.Errorf("stat /%s: %w", ClassDir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("/%s is not a directory", ClassDir)
	}
	entries, err := fs.ReadDir(fsys, ClassDir)
	if err != nil {
		return nil, fmt.Errorf("read /%s: %w", ClassDir, err)
	}
	hcas := make([]snapshot.HCA, 0, len(entries))
	for _, e := range entries {
		name := e.Name()
		dir := path.Join(ClassDir, name)
		// Real entries are symlinks into /sys/devices: DirEntry.IsDir would
		// say false, so follow the link.
		fi, err := fs.Stat(fsys, dir)
		if err != nil {
			// A dangling link still names an adapter the node has.
			hcas = append(hcas, snapshot.HCA{Name: name, Errors: []string{name + ": " + reason(err)}})
			continue
		}
		if !fi.IsDir() {
			continue
		}
		hcas = append(hcas, readDevice(fsys, dir, name))
	}
	sort.Slice(hcas, func(i, j int) bool { return naturalLess(hcas[i].Name, hcas[j].Name) })
	return hcas, nil
}

// device accumulates one adapter's read problems.
type device struct {
	fsys fs.FS
	dir  string // sys/class/infiniband/mlx5_0
	name string // mlx5_0
	errs []string
	buf  [maxValueSize + 1]byte // one value at a time; callers copy out
}

// note records a problem with the file at rel (relative to the device dir).
func (d *device) note(rel string, err error) {
	d.errs = append(d.errs, d.name+"/"+rel+": "+reason(err))
}

// value reads one attribute, trimmed. A missing optional file is "" without
// a note.
func (d *device) value(rel string, optional bool) (string, bool) {
	b, err := readValue(d.fsys, path.Join(d.dir, rel), d.buf[:])
	if err != nil {
		if !optional || !errors.Is(err, fs.ErrNotExist) {
			d.note(rel, err)
		}
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// text reads an optional identity attribute; garbage is noted and dropped.
func (d *device) text(rel string) string {
	s, ok := d.value(rel, true)
	if !ok || s == "" {
		return ""
	}
	if err := checkText(s); err != nil {
		d.note(rel, err)
		return ""
	}
	return s
}

func readDevice(fsys fs.FS, dir, name string) snapshot.HCA {
	d := &device{fsys: fsys, dir: dir, name: name}
	h := snapshot.HCA{Name: name}
	h.Model = d.text("hca_type")
	h.FWVersion = d.text("fw_ver")
	h.BoardID = d.text("board_id")

	entries, err := fs.ReadDir(fsys, path.Join(dir, "ports"))
	if err != nil {
		d.note("ports", err)
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 0 || strconv.Itoa(n) != e.Name() {
			d.note("ports/"+e.Name(), errors.New("not a port number"))
			continue
		}
		rel := "ports/" + e.Name()
		fi, err := fs.Stat(fsys, path.Join(dir, rel))
		if err != nil {
			d.note(rel, err)
			continue
		}
		if !fi.IsDir() {
			d.note(rel, errors.New("not a directory"))
			continue
		}
		h.Ports = append(h.Ports, d.port(rel, n))
	}
	sort.Slice(h.Ports, func(i, j int) bool { return h.Ports[i].Port < h.Ports[j].Port })
	h.Errors = d.errs
	return h
}

func (d *device) port(rel string, n int) snapshot.IBPort {
	p := snapshot.IBPort{Port: n}
	if s, ok := d.value(rel+"/state", false); ok {
		if v, err := parseState(s); err != nil {
			d.note(rel+"/state", err)
		} else {
			p.State = v
		}
	}
	if s, ok := d.value(rel+"/phys_state", false); ok {
		if v, err := parseState(s); err != nil {
			d.note(rel+"/phys_state", err)
		} else {
			p.PhysState = v
		}
	}
	if s, ok := d.value(rel+"/rate", false); ok {
		if g, text, err := parseRate(s); err != nil {
			d.note(rel+"/rate", err)
		} else {
			p.RateGbps, p.RateText = g, text
		}
	}
	if s, ok := d.value(rel+"/link_layer", false); ok {
		if err := checkText(s); err != nil {
			d.note(rel+"/link_layer", err)
		} else {
			p.LinkLayer = s
		}
	}
	p.Counters = d.counters(rel+"/counters", false)
	p.HWCounters = d.counters(rel+"/hw_counters", true)
	return p
}

// counters reads every file of a counters directory. A missing directory is
// nil without a note: not every driver or port type has one.
func (d *device) counters(rel string, hw bool) map[string]uint64 {
	entries, err := fs.ReadDir(d.fsys, path.Join(d.dir, rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		d.note(rel, err)
	}
	if len(entries) == 0 {
		return nil
	}
	m := make(map[string]uint64, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		frel := rel + "/" + e.Name()
		b, err := readValue(d.fsys, path.Join(d.dir, frel), d.buf[:])
		if err != nil {
			if hw && errors.Is(err, syscall.EINVAL) {
				continue // ConnectX-7 firmware refuses some hw_counters: no data
			}
			d.note(frel, err)
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(string(b)), "N/A") {
			continue // "N/A (no PMA)": the port has no such counter
		}
		v, err := parseCounter(string(b))
		if err != nil {
			d.note(frel, err)
			continue
		}
		m[e.Name()] = v
	}
	return m
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

// reason is an error's text without the full path that *fs.PathError
// repeats: callers name the file relative to the device already.
func reason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// naturalLess orders names with embedded numbers by value: mlx5_2 < mlx5_10.
func naturalLess(a, b string) bool {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if isDigit(a[i]) && isDigit(b[j]) {
			si, sj := i, j
			for i < len(a) && isDigit(a[i]) {
				i++
			}
			for j < len(b) && isDigit(b[j]) {
				j++
			}
			na := strings.TrimLeft(a[si:i], "0")
			nb := strings.TrimLeft(b[sj:j], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			continue
		}
		if a[i] != b[j] {
			return a[i] < b[j]
		}
		i++
		j++
	}
	if len(a)-i != len(b)-j {
		return len(a)-i < len(b)-j
	}
	return a < b
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
