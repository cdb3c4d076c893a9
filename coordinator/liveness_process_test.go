//go:build unix

package coordinator

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// processEnv makes the test binary, run again by
// TestStoppedCoordinatorProcessKeepsStreams, a coordinator process.
const processEnv = "FLEETCHECK_TEST_COORDINATOR_DIR"

const processInterval = 200 * time.Millisecond

// TestCoordinatorProcess is the coordinator of the real-process test: it
// prints its address and serves until its stdin closes.
func TestCoordinatorProcess(t *testing.T) {
	dir := os.Getenv(processEnv)
	if dir == "" {
		t.Skip("run by TestStoppedCoordinatorProcessKeepsStreams")
	}
	s, err := New(Config{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", DataDir: dir,
		HeartbeatInterval: processInterval, Insecure: true}, Options{Logger: zerolog.New(os.Stderr), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer stopServer(t, s)
	os.Stdout.WriteString("listening " + s.GRPCAddr().String() + "\n")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

// A coordinator process stopped with SIGSTOP for longer than three
// heartbeat intervals, while its agent goes on heartbeating into the
// socket, keeps the stream once it continues.
func TestStoppedCoordinatorProcessKeepsStreams(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCoordinatorProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), processEnv+"="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr logBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("coordinator process: %v\n%s", err, stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("coordinator process said %q (%v)\n%s", line, err, stderr.String())
	}
	a, err := connectAddr(t, addr, insecure.NewCredentials(), "gpu-001")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	var sent atomic.Int64 // the agent's heartbeats
	go func() {           // a healthy agent: heartbeats at the coordinator's interval
		tk := time.NewTicker(processInterval)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				a.heartbeat()
				sent.Add(1)
			}
		}
	}()
	heartbeats := func(n int) {
		t.Helper()
		for n > 0 {
			select {
			case m := <-a.in:
				if m.GetHeartbeat() != nil {
					n--
				}
			case <-a.ended:
				t.Fatalf("the coordinator closed the stream: %v\n%s", a.endErr, stderr.String())
			case <-time.After(10 * time.Second):
				t.Fatalf("no heartbeat from the coordinator in 10s\n%s", stderr.String())
			}
		}
	}
	heartbeats(2)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The stop is the fault itself. It lasts until the agent has sent six
	// heartbeats into the stopped coordinator's socket: more than five
	// intervals by the agent's own clock (a 30 s freeze is three against
	// the default 10 s interval), counted rather than slept.
	before := sent.Load()
	testwait.For(t, 20*processInterval, "the agent's heartbeats into the stopped coordinator", func() (bool, string) {
		n := sent.Load() - before
		return n >= 6, fmt.Sprintf("%d heartbeats sent since the stop", n)
	})
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Four sweeps after the resume, each sending a heartbeat, and the
	// stream is still up.
	heartbeats(4)
}
