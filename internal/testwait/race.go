//go:build race

package testwait

const raceScale = 4
