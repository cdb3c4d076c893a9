// Package slurmtest starts a real one-node Slurm cluster for tests: munged
// with its own key and socket, slurmctld and slurmd on 127.0.0.1, all in a
// temporary directory with a minimal slurm.conf. The Slurm tools then talk
// to it through SLURM_CONF (Env).
//
// Without the binaries (Debian: slurmctld slurmd slurm-client munge) or
// without root (slurmd runs jobs as their user) a test skips loudly, and
// fails under CI=true, where .ci/run installs them.
package slurmtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// NodeName is the cluster's one node, served by slurmd on 127.0.0.1.
const NodeName = "fc-node1"

// Config adds optional lines to slurm.conf.
type Config struct {
	// HealthCheckProgram and HealthCheckInterval (seconds) make slurmd run
	// a health check, as NHC or `fleetcheck run --slurm` is run.
	HealthCheckProgram  string
	HealthCheckInterval int
	// Prolog and Epilog run around every job on the node.
	Prolog, Epilog string
	// JobCompletion keeps a job completion log (jobcomp/filetxt, at
	// Cluster.JobCompLoc), which `sacct --completion` reads without
	// slurmdbd.
	JobCompletion bool
	// Accounting runs slurmdbd over its own MariaDB server (on loopback,
	// in the cluster's directory), so plain `sacct` answers from the
	// accounting database. Without mariadbd or slurmdbd the test skips
	// loudly (fails under CI=true).
	Accounting bool
}

// Cluster is a running test cluster.
type Cluster struct {
	// Dir holds slurm.conf, the daemons' state, spool and logs.
	Dir string
	// Conf is slurm.conf's path.
	Conf string
	// Env is what the Slurm tools need to reach this cluster.
	Env []string
	// JobCompLoc is the job completion log (Config.JobCompletion), else "".
	JobCompLoc string

	t     testing.TB
	procs []*exec.Cmd
	// daemons are the extra daemons whose logs a failed test shows.
	daemons []string
}

const (
	install           = "apt-get install slurmctld slurmd slurm-client munge"
	installAccounting = "apt-get install slurmdbd mariadb-server mariadb-client"
)

// Start starts munged, slurmctld and slurmd and waits until the node is up
// and idle. Everything stops when the test ends.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	for _, tool := range []string{"munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch", "scancel"} {
		needs.Tool(t, tool, install)
	}
	if cfg.Accounting {
		for _, tool := range []string{"mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacctmgr", "sacct"} {
			needs.Tool(t, tool, installAccounting)
		}
	}
	needs.Root(t, "slurmd starts jobs as their owner and slurmctld checks it")
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}

	// munged checks every directory above its socket: executable for all,
	// not writable by others. Test temp directories are 0700.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := &Cluster{t: t, Dir: dir, Conf: filepath.Join(dir, "slurm.conf")}
	if cfg.JobCompletion {
		c.JobCompLoc = filepath.Join(dir, "log", "jobcomp.txt")
	}
	c.Env = []string{"SLURM_CONF=" + c.Conf}
	for _, sub := range []string{"munge-key", "munge-run", "state", "spool/" + NodeName, "log"} {
		mode := os.FileMode(0o755)
		if sub == "munge-key" {
			mode = 0o700
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.stop)

	key := make([]byte, 1024)
	f, err := os.Open("/dev/urandom")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Read(key)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "munge-key", "munge.key")
	if err := os.WriteFile(keyFile, key, 0o400); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "munge-run", "munge.socket")
	c.start("munged", "munged", "--foreground", "--key-file="+keyFile, "--socket="+socket,
		"--pid-file="+filepath.Join(dir, "munge-run", "munged.pid"),
		"--log-file="+filepath.Join(dir, "log", "munged.log"),
		"--seed-file="+filepath.Join(dir, "munge-key", "munged.seed"))
	testwait.For(t, 10*time.Second, "munged's socket", func() (bool, string) {
		_, err := os.Stat(socket)
		return err == nil, c.logTail("munged")
	})

	ports := freePorts(t, 4) // slurmctld, slurmd, mariadbd, slurmdbd
	if err := os.WriteFile(c.Conf, []byte(conf(dir, socket, u.Username, ports, cfg)), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg.Accounting {
		c.daemons = append(c.daemons, "mariadbd", "slurmdbd")
		c.startAccounting(socket, u.Username, ports[2], ports[3])
	}
	c.start("slurmctld", "slurmctld", "-D", "-i")
	c.start("slurmd", "slurmd", "-D", "-N", NodeName)
	testwait.ForEvery(t, 30*time.Second, 200*time.Millisecond, "node "+NodeName+" idle", func() (bool, string) {
		st, _, err := c.node()
		if err != nil {
			return false, err.Error() + "\n" + c.logTail("slurmctld") + c.logTail("slurmd")
		}
		return st == "IDLE", "State=" + st
	})
	return c
}

// conf is the minimal slurm.conf: loopback only, no cgroups (proctrack
// by /proc, no task plugin, no accounting database; a job completion
// log when asked), one node with one CPU.
func conf(dir, socket, slurmUser string, ports []int, cfg Config) string {
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	line("ClusterName=fleetchecktest")
	line("SlurmctldHost=localhost(127.0.0.1)")
	line("SlurmctldPort=%d", ports[0])
	line("SlurmdPort=%d", ports[1])
	line("SlurmUser=%s", slurmUser)
	line("SlurmdUser=root")
	line("AuthType=auth/munge")
	line("CredType=cred/munge")
	line("AuthInfo=socket=%s", socket)
	line("StateSaveLocation=%s/state", dir)
	line("SlurmdSpoolDir=%s/spool/%%n", dir)
	line("SlurmctldPidFile=%s/slurmctld.pid", dir)
	line("SlurmdPidFile=%s/slurmd.%%n.pid", dir)
	line("SlurmctldLogFile=%s/log/slurmctld.log", dir)
	line("SlurmdLogFile=%s/log/slurmd.log", dir)
	line("ProctrackType=proctrack/linuxproc")
	line("TaskPlugin=task/none")
	line("JobAcctGatherType=jobacct_gather/none")
	if cfg.Accounting {
		line("AccountingStorageType=accounting_storage/slurmdbd")
		line("AccountingStorageHost=127.0.0.1")
		line("AccountingStoragePort=%d", ports[3])
		// For auth/munge this names the munge socket of the connections
		// to slurmdbd (AuthInfo covers the others).
		line("AccountingStoragePass=%s", socket)
	} else {
		line("AccountingStorageType=accounting_storage/none")
	}
	if cfg.JobCompletion {
		line("JobCompType=jobcomp/filetxt")
		line("JobCompLoc=%s/log/jobcomp.txt", dir)
	} else {
		line("JobCompType=jobcomp/none")
	}
	line("MpiDefault=none")
	line("MailProg=/bin/true")
	line("SelectType=select/cons_tres")
	line("SelectTypeParameters=CR_CPU")
	line("SchedulerType=sched/builtin")
	line("ReturnToService=2")
	line("SlurmdTimeout=60")
	if cfg.HealthCheckProgram != "" {
		line("HealthCheckProgram=%s", cfg.HealthCheckProgram)
		line("HealthCheckInterval=%d", max(cfg.HealthCheckInterval, 1))
		line("HealthCheckNodeState=ANY")
	}
	if cfg.Prolog != "" {
		line("Prolog=%s", cfg.Prolog)
	}
	if cfg.Epilog != "" {
		line("Epilog=%s", cfg.Epilog)
	}
	line("NodeName=%s NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=1 RealMemory=64 State=UNKNOWN", NodeName)
	line("PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP", NodeName)
	return b.String()
}

// dbPassword is the test database user's; the server listens on
// loopback only and lives as long as the test.
const dbPassword = "fleetcheck-test"

// startAccounting starts a MariaDB server of the cluster's own (data
// directory, socket and a loopback port under Dir) and slurmdbd over it,
// and registers the cluster, before slurmctld starts.
func (c *Cluster) startAccounting(mungeSocket, slurmUser string, dbPort, dbdPort int) {
	c.t.Helper()
	data := filepath.Join(c.Dir, "mysql", "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		c.t.Fatal(err)
	}
	if out, err := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		c.t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	sock := filepath.Join(c.Dir, "mysql", "mysqld.sock")
	c.start("mariadbd", "mariadbd", "--no-defaults", "--datadir="+data, "--socket="+sock,
		"--bind-address=127.0.0.1", fmt.Sprintf("--port=%d", dbPort), "--user=root", "--skip-name-resolve",
		"--pid-file="+filepath.Join(c.Dir, "mysql", "mysqld.pid"), "--log-error="+filepath.Join(c.Dir, "log", "mariadbd.log"))
	sql := fmt.Sprintf("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '%s'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';", dbPassword)
	testwait.For(c.t, 60*time.Second, "mariadbd answering", func() (bool, string) {
		out, err := exec.Command("mariadb", "--no-defaults", "--socket="+sock, "-u", "root", "-e", sql).CombinedOutput()
		return err == nil, string(out) + c.logTail("mariadbd")
	})

	// slurmdbd reads slurmdbd.conf beside SLURM_CONF's slurm.conf, and
	// only if its owner alone can read it.
	var b strings.Builder
	for _, l := range []string{
		"AuthType=auth/munge",
		"AuthInfo=socket=" + mungeSocket,
		"DbdHost=localhost",
		"DbdAddr=127.0.0.1",
		fmt.Sprintf("DbdPort=%d", dbdPort),
		"SlurmUser=" + slurmUser,
		"PidFile=" + filepath.Join(c.Dir, "slurmdbd.pid"),
		"LogFile=" + filepath.Join(c.Dir, "log", "slurmdbd.log"),
		"StorageType=accounting_storage/mysql",
		"StorageHost=127.0.0.1",
		fmt.Sprintf("StoragePort=%d", dbPort),
		"StorageUser=slurm",
		"StoragePass=" + dbPassword,
		"StorageLoc=slurm_acct_db",
	} {
		b.WriteString(l + "\n")
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "slurmdbd.conf"), []byte(b.String()), 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.start("slurmdbd", "slurmdbd", "-D")
	testwait.For(c.t, 60*time.Second, "slurmdbd taking the cluster", func() (bool, string) {
		out, err := c.Run("sacctmgr", "-i", "add", "cluster", "fleetchecktest")
		if err == nil || strings.Contains(out, "already exists") {
			return true, ""
		}
		return false, err.Error() + "\n" + c.logTail("slurmdbd")
	})
}

// freePorts picks n free loopback ports. They are closed again before
// slurmctld binds them: another process could take one in between, which
// shows as slurmctld failing to start.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func (c *Cluster) start(name, path string, args ...string) {
	c.t.Helper()
	out, err := os.Create(filepath.Join(c.Dir, "log", name+".out"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.procs = append(c.procs, cmd)
}

// stop cancels the jobs left (their steps outlive slurmd) and stops the
// daemons in reverse order; on a failed test it logs their logs' tails.
func (c *Cluster) stop() {
	if len(c.procs) >= 3 {
		c.Run("scancel", "--full", "--partition=debug")
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if out, err := c.Run("squeue", "-h", "-o", "%i"); err != nil || strings.TrimSpace(out) == "" {
				break
			}
			time.Sleep(100 * time.Millisecond) // cleanup: no test to fail with testwait any more
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	if c.t.Failed() {
		for _, n := range append([]string{"munged", "slurmctld", "slurmd"}, c.daemons...) {
			c.t.Logf("%s", c.logTail(n))
		}
	}
}

// logTail is the end of a daemon's log, for failure messages.
func (c *Cluster) logTail(name string) string {
	var b strings.Builder
	for _, f := range []string{name + ".out", name + ".log"} {
		data, err := os.ReadFile(filepath.Join(c.Dir, "log", f))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		lines = lines[max(0, len(lines)-15):]
		fmt.Fprintf(&b, "--- %s (last lines) ---\n%s\n", f, strings.Join(lines, "\n"))
	}
	return b.String()
}

// Run runs a Slurm tool against the cluster and returns its output.
func (c *Cluster) Run(tool string, args ...string) (string, error) {
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// MustRun is Run that fails the test on an error.
func (c *Cluster) MustRun(tool string, args ...string) string {
	c.t.Helper()
	out, err := c.Run(tool, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

var (
	stateField  = regexp.MustCompile(`(?m)\bState=(\S+)`)
	reasonField = regexp.MustCompile(`(?m)\bReason=(.*)$`)
	// Slurm appends who set the reason and when: "Reason=x [root@2026-...]".
	reasonStamp = regexp.MustCompile(`\s*\[[^\]]*@[^\]]*\]\s*$`)
)

// node reads the node's State= and Reason= from `scontrol show node`.
func (c *Cluster) node() (state, reason string, err error) {
	out, err := c.Run("scontrol", "show", "node", NodeName)
	if err != nil {
		return "", "", err
	}
	m := stateField.FindStringSubmatch(out)
	if m == nil {
		return "", "", fmt.Errorf("no State= in scontrol show node: %q", out)
	}
	state = m[1]
	if r := reasonField.FindStringSubmatch(out); r != nil {
		reason = reasonStamp.ReplaceAllString(strings.TrimSpace(r[1]), "")
	}
	return state, reason, nil
}

// Node is the node's state ("IDLE", "IDLE+DRAIN", "ALLOCATED+DRAIN") and
// drain reason (without Slurm's [user@time] stamp) as scontrol shows them.
// The NOT_RESPONDING flag is left out: slurmctld sets it on every resume
// until its next ping of slurmd, up to a minute later.
func (c *Cluster) Node() (state, reason string) {
	c.t.Helper()
	state, reason, err := c.node()
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.ReplaceAll(state, "+NOT_RESPONDING", ""), reason
}

// Submit starts a batch job on the node and returns its id; the job is
// cancelled when the test ends.
func (c *Cluster) Submit(wrap string) string {
	c.t.Helper()
	out := c.MustRun("sbatch", "--parsable", "-w", NodeName, "-o", "/dev/null", "-D", c.Dir, "--wrap", wrap)
	id, _, _ := strings.Cut(strings.TrimSpace(out), ";")
	return id
}
