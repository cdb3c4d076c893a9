// Package compat is the driver/firmware compatibility matrix: which driver
// versions a GPU model allows, which Fabric Manager goes with a driver, the
// minimum HCA firmware, RDMA stack and kernel ranges, and known-bad
// combinations. It answers both "is this node's combination allowed?" and
// "would this TARGET version be allowed on this node?".
package compat

// Matrix is a parsed, validated compatibility matrix.
// (Types and loader are completed in matrix_load.go / evaluate.go.)
type Matrix struct {
	raw matrixFile
}
