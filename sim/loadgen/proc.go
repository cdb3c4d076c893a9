package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a reading of another process's memory and CPU from /proc.
type Proc struct {
	RSSKiB int64         // VmRSS
	CPU    time.Duration // user + system time so far, all threads
}

// userHZ is the unit of /proc/PID/stat times. Linux fixes it at 100 for
// userspace whatever the kernel's own tick.
const userHZ = 100

// ReadProc reads pid's resident memory and CPU time (Linux).
func ReadProc(pid int) (Proc, error) {
	var p Proc
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return p, fmt.Errorf("read process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) < 1 {
				break
			}
			if p.RSSKiB, err = strconv.ParseInt(f[0], 10, 64); err != nil {
				return p, fmt.Errorf("process %d VmRSS %q: %w", pid, v, err)
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return p, fmt.Errorf("read process %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces: count from after it.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return p, fmt.Errorf("process %d stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	// Fields after the name start at 3 (state); utime is 14, stime 15.
	if len(f) < 13 {
		return p, fmt.Errorf("process %d stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return p, fmt.Errorf("process %d stat: utime %q stime %q", pid, f[11], f[12])
	}
	p.CPU = time.Duration(ut+st) * time.Second / userHZ
	return p, nil
}

// RaiseFileLimit lifts this process's soft limit on open files to the hard
// limit: each simulated agent holds a connection. It returns the limit now
// in force.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read open file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("raise open file limit to %d: %w", lim.Max, err)
		}
	}
	return lim.Cur, nil
}

// Machine is the whole machine's CPU time so far, from /proc/stat: what
// every process used, busy, and the time all CPUs had, total; and its load
// average over the last minute with the CPUs it has, from /proc/loadavg,
// which a figure measured on a shared machine must be read with.
type Machine struct {
	Busy, Total time.Duration
	Load1       float64
	CPUs        int
}

// ReadMachine reads /proc/stat (Linux). Benchmarks on a shared machine
// report how much of it other processes took meanwhile.
func ReadMachine() (Machine, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Machine{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return Machine{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var m Machine
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Machine{}, fmt.Errorf("/proc/stat: %q: %w", v, err)
		}
		d := time.Duration(n) * time.Second / userHZ
		m.Total += d
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already in user.
		switch i {
		case 3, 4, 8, 9:
		default:
			m.Busy += d
		}
		if i == 7 { // steal: the hypervisor gave the time to someone else
			m.Busy -= d
			m.Total -= d
		}
	}
	m.CPUs = runtime.NumCPU()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load1, err = parseLoadAvg(string(b))
		if err != nil {
			return Machine{}, err
		}
	}
	return m, nil
}

// parseLoadAvg reads the one-minute load average from /proc/loadavg
// ("0.42 0.61 0.50 1/123 4567").
func parseLoadAvg(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/loadavg: empty")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("/proc/loadavg: %q is not a load average", f[0])
	}
	return v, nil
}
