package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// A CDI spec whose devices carry a createRuntime hook: "ok" runs a script that keeps the OCI
// state it is given, "fails" one that exits 1.
func hookSpec(t *testing.T, dir string) {
	t.Helper()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := script("ok.sh", `cat > "$OUT/state.json"; echo "$@" > "$OUT/args"`+"\n")
	fails := script("fails.sh", "echo 'no such GPU' >&2; exit 1\n")
	spec := map[string]any{
		"cdiVersion": "0.6.0",
		"kind":       "example.com/gpu",
		"devices": []any{
			map[string]any{"name": "ok", "containerEdits": map[string]any{
				"env": []string{"NVIDIA_GPU_MEMORY_LIMIT=10240"},
				"hooks": []any{map[string]any{
					"hookName": "createRuntime", "path": ok,
					"args": []string{"nvidia-ctk", "hook", "apply-cuda-memory-limits"},
					"env":  []string{"OUT=" + dir},
				}},
			}},
			map[string]any{"name": "fails", "containerEdits": map[string]any{
				"env":   []string{"X=1"},
				"hooks": []any{map[string]any{"hookName": "createRuntime", "path": fails}},
			}},
		},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cdi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cdi", "example.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func request(device string, env ...string) *runtimeapi.CreateContainerRequest {
	var kvs []*runtimeapi.KeyValue
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		kvs = append(kvs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	return &runtimeapi.CreateContainerRequest{
		PodSandboxId: "sandbox",
		Config: &runtimeapi.ContainerConfig{
			Metadata:   &runtimeapi.ContainerMetadata{Name: "c-" + device},
			Image:      &runtimeapi.ImageSpec{Image: "pause"},
			Envs:       kvs,
			CDIDevices: []*runtimeapi.CDIDevice{{Name: "example.com/gpu=" + device}},
		},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns"}},
	}
}

// The hook runs with the container's state on stdin and its bundle's config.json holding the
// kubelet's environment with the CDI edits applied over it: a variable the container sets
// itself is replaced by the device's.
func TestCreateRuntimeHooksRunOnTheMergedSpec(t *testing.T) {
	dir := t.TempDir()
	hookSpec(t, dir)
	r := &cdiRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), cdiDir: filepath.Join(dir, "cdi"),
		record: filepath.Join(dir, "record"), bundles: filepath.Join(dir, "bundles")}
	resp, err := r.CreateContainer(context.Background(), request("ok", "A=1", "NVIDIA_GPU_MEMORY_LIMIT=999999"))
	if err != nil {
		t.Fatal(err)
	}
	var state oci.State
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatalf("the hook did not run: %v", err)
	}
	if err := json.Unmarshal(b, &state); err != nil {
		t.Fatal(err)
	}
	if state.ID != resp.GetContainerId() || state.Status != oci.StateCreating ||
		state.Bundle != filepath.Join(dir, "bundles", resp.GetContainerId()) {
		t.Fatalf("state %+v for container %s", state, resp.GetContainerId())
	}
	var spec oci.Spec
	b, err = os.ReadFile(filepath.Join(state.Bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if want := []string{"A=1", "NVIDIA_GPU_MEMORY_LIMIT=10240"}; !slices.Equal(spec.Process.Env, want) {
		t.Fatalf("config.json env %v, want %v", spec.Process.Env, want)
	}
	if args, _ := os.ReadFile(filepath.Join(dir, "args")); string(args) != "hook apply-cuda-memory-limits\n" {
		t.Fatalf("the hook's arguments: %q", args)
	}
	var rec created
	b, err = os.ReadFile(r.record)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ID != resp.GetContainerId() || len(rec.Hooks) != 1 || rec.Hooks[0].Args[1] != "hook" {
		t.Fatalf("record %+v", rec)
	}
}

// A failing hook fails the creation, in runc's words with the hook's stderr, and leaves no
// container behind and nothing recorded.
func TestAFailingCreateRuntimeHookFailsTheContainer(t *testing.T) {
	dir := t.TempDir()
	hookSpec(t, dir)
	r := &cdiRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), cdiDir: filepath.Join(dir, "cdi"),
		record: filepath.Join(dir, "record"), bundles: filepath.Join(dir, "bundles")}
	_, err := r.CreateContainer(context.Background(), request("fails"))
	if err == nil || !strings.Contains(err.Error(), "error running createRuntime hook #0") ||
		!strings.Contains(err.Error(), "no such GPU") {
		t.Fatalf("error %v", err)
	}
	list, err := r.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err != nil || len(list.GetContainers()) != 0 {
		t.Fatalf("containers left: %v %v", list.GetContainers(), err)
	}
	if _, err := os.Stat(r.record); !os.IsNotExist(err) {
		t.Fatalf("a failed container was recorded: %v", err)
	}
}
