//go:build !unix

package runcmd

import (
	"os"
	"os/exec"
	"syscall"
)

// Without process groups only the program itself can be stopped.
func setProcessGroup(*exec.Cmd) {}

func signalGroup(pid int, _ syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
