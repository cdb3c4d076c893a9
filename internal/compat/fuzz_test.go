package compat

import (
	"os"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzParse: any input gives a matrix or an error, never a panic; a matrix
// that parses survives a round trip and can judge a node.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join("..", "..", "examples", "matrix.yaml")); err == nil {
		f.Add(data)
	}
	f.Add([]byte(testMatrix))
	for _, s := range []string{
		"", "{}", "kernels: '*'", "gpus:\n  - model: H100\n    drivers: '>=560, <535'\n",
		"known_bad:\n  - when: {driver: 550.54.14, vbios: 96.00.74.*}\n    reason: x\n",
		"gpus:\n  - &r {model: H100, drivers: ['1']}\n  - *r\n",
		"rdma_stacks: ['MLNX_OFED >=23.10', 'DOCA']\n",
		"fabric_manager:\n  - {driver: '535.*', version: same, gpu_model: 're:SXM|HBM3'}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		n := pinnedNode()
		v1 := m.Evaluate(n)
		m.Allows(n, Target{Driver: "550.90.07", FabricManager: "same", HCAFirmware: map[string]string{"*": "1"}})
		m.Evaluate(Node{GPUs: []GPU{{Name: "x"}}, HCAs: []HCA{{Model: "MT4129"}}})
		out, err := yaml.Marshal(m)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		m2, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of\n%s\nfailed: %v\ninput:\n%s", out, err, data)
		}
		v2 := m2.Evaluate(n)
		if len(v1.Violations) != len(v2.Violations) || len(v1.Unknown) != len(v2.Unknown) || v1.Checked != v2.Checked {
			t.Fatalf("verdict changed after round trip:\n%+v\n%+v\ninput:\n%s\nout:\n%s", v1, v2, data, out)
		}
	})
}
