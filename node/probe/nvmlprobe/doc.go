// Package nvmlprobe reads the node's GPUs through NVML (go-nvml) into the
// same snapshot.GPUState that the nvidia-smi XML parser fills, so every check
// works on either source.
//
// NVML needs cgo (go-nvml does not build without it) but not the library at
// build time: libnvidia-ml.so.1 is opened at Init. So:
//
//   - Collect opens NVML, reads it and closes it; it exists in every build.
//     Without cgo, or off Linux, it returns ErrUnavailable ("NVML not
//     available: built without cgo"), and callers fall back to nvidia-smi.
//   - Open and Read exist only in cgo builds on Linux, because their
//     signatures name go-nvml's types. Read takes any nvml.Interface, so
//     tests drive it with go-nvml's mock servers (mock/dgxa100, dgxh100).
//
// A query that NVML answers with ERROR_NOT_SUPPORTED or ERROR_NOT_FOUND, or
// that the loaded driver lacks, leaves its field nil. A query that panics (a partial NVML
// implementation such as a mock with a method left nil) counts as not
// supported, so one gap cannot take the agent down. Any other failure is
// recorded in GPUState.Errors, naming the GPU and the call, and the read goes
// on. Only a failed device count fails the whole read.
//
// NVML calls can block on a GPU in a bad state; callers run Collect under
// their own deadline, like every other probe.
package nvmlprobe

import "errors"

// ErrUnavailable says NVML cannot be used on this host or in this build:
// the library does not load, or the binary was built without cgo. Any error
// from Open or Collect means "use nvidia-smi instead"; this one also means
// "and do not report it as a fault".
var ErrUnavailable = errors.New("NVML not available")
