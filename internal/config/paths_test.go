package config

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLoadPathsRelativeToFile: run/analyze --config take matrix_file and
// tool programs given with a directory against the file's directory.
func TestLoadPathsRelativeToFile(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "etc")
	other := filepath.Join(root, "cwd")
	for _, d := range []string{conf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	matrix, err := os.ReadFile("../../examples/matrix.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "matrix.yaml"), matrix, 0o644); err != nil {
		t.Fatal(err)
	}
	body := "matrix_file: matrix.yaml\ntools: {nvidia_smi: bin/nvidia-smi, dmesg: dmesg, all_reduce_perf: /opt/nccl-tests/all_reduce_perf}\n"
	if err := os.WriteFile(filepath.Join(conf, "node.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	c, err := Load("../etc/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Matrix == nil || c.MatrixFile != filepath.Join(conf, "matrix.yaml") {
		t.Errorf("matrix_file %q, matrix loaded %v", c.MatrixFile, c.Matrix != nil)
	}
	if c.Tools.NvidiaSMI != filepath.Join(conf, "bin/nvidia-smi") || c.Tools.Dmesg != "dmesg" || c.Tools.AllReducePerf != "/opt/nccl-tests/all_reduce_perf" {
		t.Errorf("tools %+v", c.Tools)
	}
}
