package main

// Which process a control plane's directory names, and whether it still runs.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

const pidFileName = "controlplane.pid"

func readPid(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// isControlPlane reports whether pid is alive and is this program (guards against pid reuse).
func isControlPlane(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(cmdline), "\x00")
	return len(args) > 1 && strings.HasSuffix(args[0], "controlplane") && args[1] == "up"
}
