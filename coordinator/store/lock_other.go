//go:build !unix

package store

import "os"

// lockDir is a no-op where flock does not exist; run one coordinator per
// data directory there.
func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
}
