package nvsmi

import (
	"os"
	"testing"
)

func BenchmarkParse(b *testing.B) {
	for _, name := range []string{"h100x8_v12.xml", "a10g_v11.xml"} {
		data, err := os.ReadFile("testdata/" + name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
