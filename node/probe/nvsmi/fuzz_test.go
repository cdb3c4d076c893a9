package nvsmi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: any input gives a state or an error naming the source, never a
// panic, and a state always encodes as JSON (no NaN or infinity sneaks in).
func FuzzParse(f *testing.F) {
	for _, name := range fixtures {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(doc(`<remapped_rows>N/A</remapped_rows><ecc_errors><volatile><single_bit><total>1</total></single_bit></volatile></ecc_errors>`))
	f.Add([]byte(`<nvidia_smi_log><gpu id="0000:01:00"><![CDATA[x]]><!-- c --><a b='&#x41;'/></gpu></nvidia_smi_log>`))
	f.Add([]byte("Unable to determine the device handle for GPU0000:9B:00.0: Unknown Error\n"))
	f.Add([]byte("Unable to determine the device handle for GPU: : \nUnable to detect the device handle for GPU 0:0:0: x\n<nvidia_smi_log/>"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Parse(data)
		if err != nil {
			if st != nil {
				t.Fatalf("state and error together: %v", err)
			}
			return
		}
		for i, g := range st.GPUs {
			if g.Index != i {
				t.Fatalf("GPU %d has index %d", i, g.Index)
			}
		}
		if _, err := json.Marshal(st); err != nil {
			t.Fatalf("state does not encode: %v", err)
		}
	})
}
