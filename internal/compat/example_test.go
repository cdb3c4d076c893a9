package compat_test

import (
	"fmt"

	"github.com/fleetcheck/fleetcheck/internal/compat"
)

// The rollout gate's question: may this node move to driver 550.90.07?
func ExampleMatrix_Allows() {
	m, err := compat.Parse([]byte(`
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.129.03", ">=550.90.07, <551"]
fabric_manager:
  - driver: "*"
    version: same
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	node := compat.Node{
		Driver:        "535.129.03",
		FabricManager: "535.129.03",
		GPUs:          []compat.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3"}},
	}
	ok, v := m.Allows(node, compat.Target{Driver: "550.90.07"})
	fmt.Println(ok)
	for _, x := range v.Violations {
		fmt.Println(x.Kind, x.Have, "->", x.Want)
	}
	ok, _ = m.Allows(node, compat.Target{Driver: "550.90.07", FabricManager: "same"})
	fmt.Println(ok)
	// Output:
	// false
	// fabric_manager 535.129.03 -> 550.90.07
	// true
}
