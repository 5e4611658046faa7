package main

// The container's OCI spec as the runtime builds it, and the createRuntime hooks run on it the
// way runc runs them: containerd builds the spec from the kubelet's request, applies the CDI
// edits of the container's devices, and runc runs each createRuntime hook with the container's
// state on stdin and its bundle (holding config.json) on disk, failing the container's creation
// when a hook fails. Device nodes are left out of the edits: this machine has no GPU device nodes
// to stat.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// ranHook is one hook as the runtime ran it.
type ranHook struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
}

// baseSpec is the container's spec before CDI: its command and the kubelet's environment.
func baseSpec(cfg *runtimeapi.ContainerConfig) *oci.Spec {
	var env []string
	for _, kv := range cfg.GetEnvs() {
		env = append(env, kv.GetKey()+"="+string(kv.GetValue()))
	}
	args := append(append([]string{}, cfg.GetCommand()...), cfg.GetArgs()...)
	if len(args) == 0 {
		args = []string{"/pause"}
	}
	return &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{Env: env, Args: args, Cwd: "/"},
		Root:    &oci.Root{Path: "rootfs"},
	}
}

// withoutDeviceNodes is a copy of edits without their device nodes.
func withoutDeviceNodes(e cdispec.ContainerEdits) *cdi.ContainerEdits {
	e.DeviceNodes = nil
	return &cdi.ContainerEdits{ContainerEdits: &e}
}

// createRuntimeHooks writes the container's bundle (config.json from spec) under dir and runs
// spec's createRuntime hooks in order, as runc does: the hook's path, its args as argv, its env
// (runc's own environment when it sets none), the container's state on stdin, its timeout. The
// first failure stops the rest and is returned in runc's words.
func createRuntimeHooks(spec *oci.Spec, id, dir string) ([]ranHook, error) {
	if spec.Hooks == nil || len(spec.Hooks.CreateRuntime) == 0 {
		return nil, nil
	}
	bundle := filepath.Join(dir, id)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, err
	}
	config, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		return nil, err
	}
	state, err := json.Marshal(oci.State{
		Version: spec.Version, ID: id, Status: oci.StateCreating, Bundle: bundle, Annotations: spec.Annotations,
	})
	if err != nil {
		return nil, err
	}
	var ran []ranHook
	for i, h := range spec.Hooks.CreateRuntime {
		if err := runHook(h, state); err != nil {
			return ran, fmt.Errorf("error running createRuntime hook #%d: %w", i, err)
		}
		ran = append(ran, ranHook{Path: h.Path, Args: h.Args})
	}
	return ran, nil
}

func runHook(h oci.Hook, state []byte) error {
	ctx := context.Background()
	if h.Timeout != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(*h.Timeout)*time.Second)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, h.Path)
	if len(h.Args) > 0 {
		cmd.Args = h.Args
	}
	cmd.Env = h.Env
	cmd.Stdin = bytes.NewReader(state)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w, stdout: %s, stderr: %s", err, stdout.String(), stderr.String())
	}
	return nil
}
