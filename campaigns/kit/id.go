package kit

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// idTime is the time part of a campaign id: readable, UTC, sorts by start.
const idTime = "20060102T150405Z"

// NewID makes a campaign id an operator can read and type:
// PREFIX-YYYYMMDDTHHMMSSZ-RANDOM ("b-20260302T020000Z-4f0c1a"), from the
// campaign clock's now. The random part keeps ids started in the same
// second (or by two coordinators) apart.
func NewID(prefix string, now time.Time) string {
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail on supported platforms
	return prefix + "-" + now.UTC().Format(idTime) + "-" + hex.EncodeToString(b[:])
}
