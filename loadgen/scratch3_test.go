package loadgen

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator"
)

func TestScratchCoordCPU(t *testing.T) {
	if os.Getenv("SCRATCH_CPU") == "" {
		t.Skip()
	}
	srv, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), Insecure: true},
		coordinator.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	cmd := exec.Command("/tmp/lg", "-coordinator", srv.GRPCAddr().String(), "-coordinator-pid", "0", "-agents", os.Getenv("SCRATCH_AGENTS"), "-settle", "1s",
		"-initial-pass="+os.Getenv("SCRATCH_INITIAL"), "-connect-concurrency", "512",
		"-check-runs", os.Getenv("SCRATCH_RUNS"), "-sustain", os.Getenv("SCRATCH_SUSTAIN"), "-window", "2", "-bundle", "../examples/bundles/h100-healthy")
	cmd.Stderr = os.Stderr
	pr, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pr)
	var f *os.File
	for sc.Scan() {
		line := sc.Text()
		os.Stdout.WriteString(line + "\n")
		if f == nil && strings.Contains(line, "per idle agent") || f == nil && strings.Contains(line, "CPU while connecting") && os.Getenv("SCRATCH_INITIAL") == "false" {
			f, _ = os.Create("/tmp/coordcpu.out")
			pprof.StartCPUProfile(f)
		}
	}
	if f != nil {
		pprof.StopCPUProfile()
		f.Close()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}
