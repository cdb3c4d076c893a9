package loadgen

import (
	"context"
	"os"
	"os/exec"
	"runtime/pprof"
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
	f, _ := os.Create("/tmp/coordcpu.out")
	pprof.StartCPUProfile(f)
	defer func() { pprof.StopCPUProfile(); f.Close() }()
	cmd := exec.Command("/tmp/lg", "-coordinator", srv.GRPCAddr().String(), "-coordinator-pid", "0", "-agents", "1000", "-settle", "1s",
		"-check-runs", os.Getenv("SCRATCH_RUNS"), "-sustain", os.Getenv("SCRATCH_SUSTAIN"), "-window", "2", "-bundle", "../examples/bundles/h100-healthy")
	cmd.Stderr = os.Stderr
	cmd.Stdout = os.Stdout
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
}
