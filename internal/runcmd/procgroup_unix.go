//go:build unix

package runcmd

import (
	"os/exec"
	"syscall"
)

// setProcessGroup puts the command in a new process group led by itself,
// so signalGroup reaches every descendant that did not leave the group.
func setProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// signalGroup signals the process group whose leader is pid. Errors are
// ignored: ESRCH only means the group is already gone.
func signalGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
	}
}
