package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validSpec is a spec as the agent writes one for a prepared claim whose UID starts with a
// letter (0.3.0 expresses it).
const validSpec = `{
  "cdiVersion": "0.3.0",
  "kind": "gputenancy.io/gpu",
  "devices": [
    {
      "name": "uid1-gpu-0",
      "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1"],
        "deviceNodes": [{"path": "/dev/nvidia0"}],
        "mounts": [{"hostPath": "/run/x", "containerPath": "/run/y", "options": ["rbind", "rw"]}]
      }
    }
  ]
}
`

// writeSpec writes content to dir/name and returns its path.
func writeSpec(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCheck runs the command with args and returns its exit code and stdout.
func runCheck(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	t.Logf("cdi-check %s -> %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String()
}

func TestValidSpec(t *testing.T) {
	path := writeSpec(t, t.TempDir(), "gputenancy.io-gpu_uid1.json", validSpec)

	spec, err := checkFile(path)
	if err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	if spec.Kind != "gputenancy.io/gpu" {
		t.Errorf("kind %q", spec.Kind)
	}
	if want := []string{"gputenancy.io/gpu=uid1-gpu-0"}; strings.Join(spec.Devices, " ") != strings.Join(want, " ") {
		t.Errorf("devices %q, want %q", spec.Devices, want)
	}

	code, out := runCheck(t, path)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if want := "ok " + path + ": kind gputenancy.io/gpu, 1 devices: gputenancy.io/gpu=uid1-gpu-0\n"; out != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

func TestValidYamlSpec(t *testing.T) {
	yaml := `cdiVersion: "1.1.0"
kind: gputenancy.io/gpu
devices:
  - name: uid1-gpu-0
    containerEdits:
      env: ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
  - name: uid1-gpu-1
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1}]
`
	path := writeSpec(t, t.TempDir(), "spec.yaml", yaml)
	code, out := runCheck(t, path)
	if code != 0 || !strings.HasSuffix(out, ": kind gputenancy.io/gpu, 2 devices: gputenancy.io/gpu=uid1-gpu-0 gputenancy.io/gpu=uid1-gpu-1\n") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

// TestInvalidSpecs holds each spec to what the library refuses, asserting on
// the library's own error text.
func TestInvalidSpecs(t *testing.T) {
	cases := []struct {
		name    string
		spec    string
		wantErr string
	}{
		{
			name:    "kind without class",
			spec:    strings.Replace(validSpec, `"gputenancy.io/gpu"`, `"gputenancy.io"`, 1),
			wantErr: `invalid vendor. empty name`,
		},
		{
			name:    "device name with a space",
			spec:    strings.Replace(validSpec, `"uid1-gpu-0"`, `"uid1 gpu-0"`, 1),
			wantErr: `invalid character ' ' in device name "uid1 gpu-0"`,
		},
		{
			name:    "device name ending in a dash",
			spec:    strings.Replace(validSpec, `"uid1-gpu-0"`, `"uid1-gpu-"`, 1),
			wantErr: `invalid name "uid1-gpu-", should end with a letter or digit`,
		},
		{
			name:    "class with an invalid character",
			spec:    strings.Replace(validSpec, `"gputenancy.io/gpu"`, `"gputenancy.io/g=u"`, 1),
			wantErr: `invalid class. invalid character '=' in name "g=u"`,
		},
		{
			name:    "unknown cdiVersion",
			spec:    strings.Replace(validSpec, `"0.3.0"`, `"1.2.0"`, 1),
			wantErr: `invalid version "1.2.0"`,
		},
		{
			name: "cdiVersion older than the features used",
			spec: strings.Replace(
				strings.Replace(validSpec, `"0.3.0"`, `"0.5.0"`, 1),
				`"name": "uid1-gpu-0",`, `"name": "uid1-gpu-0", "annotations": {"a": "b"},`, 1),
			wantErr: `the spec version must be at least v0.6.0`,
		},
		{
			name:    "unknown field",
			spec:    strings.Replace(validSpec, `"deviceNodes"`, `"devicenodes"`, 1),
			wantErr: `field devicenodes not found`,
		},
		{
			name:    "env entry without =",
			spec:    strings.Replace(validSpec, `"NVIDIA_VISIBLE_DEVICES=GPU-1"`, `"NVIDIA_VISIBLE_DEVICES"`, 1),
			wantErr: `invalid environment variable "NVIDIA_VISIBLE_DEVICES"`,
		},
		{
			name:    "mount without container path",
			spec:    strings.Replace(validSpec, `"containerPath": "/run/y"`, `"containerPath": ""`, 1),
			wantErr: `invalid mount, empty container path`,
		},
		{
			name:    "device node without path",
			spec:    strings.Replace(validSpec, `{"path": "/dev/nvidia0"}`, `{"path": ""}`, 1),
			wantErr: `invalid (empty) device path`,
		},
		{
			name:    "device node with bad permissions",
			spec:    strings.Replace(validSpec, `{"path": "/dev/nvidia0"}`, `{"path": "/dev/nvidia0", "permissions": "rwx"}`, 1),
			wantErr: `device "/dev/nvidia0": invalid permissions "rwx"`,
		},
		{
			name: "device without container edits",
			spec: `{"cdiVersion": "1.1.0", "kind": "gputenancy.io/gpu",
			        "devices": [{"name": "uid1-gpu-0", "containerEdits": {}}]}`,
			wantErr: `invalid device, empty device edits`,
		},
		{
			name:    "no devices",
			spec:    `{"cdiVersion": "1.1.0", "kind": "gputenancy.io/gpu", "devices": []}`,
			wantErr: `invalid spec, no devices`,
		},
		{
			name: "duplicate device",
			spec: `{"cdiVersion": "1.1.0", "kind": "gputenancy.io/gpu", "devices": [
			        {"name": "uid1-gpu-0", "containerEdits": {"env": ["A=1"]}},
			        {"name": "uid1-gpu-0", "containerEdits": {"env": ["A=2"]}}]}`,
			wantErr: `invalid spec, multiple device "uid1-gpu-0"`,
		},
		{
			name:    "not JSON or YAML",
			spec:    `{"cdiVersion": "1.1.0",`,
			wantErr: `failed to parse CDI Spec`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeSpec(t, t.TempDir(), "spec.json", c.spec)
			_, err := checkFile(path)
			if err == nil {
				t.Fatalf("library accepted the spec; want an error with %q", c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error %q, want it to contain %q", err, c.wantErr)
			}
			code, out := runCheck(t, path)
			if code != 1 || out != "invalid "+path+": "+oneLine(err)+"\n" {
				t.Fatalf("exit %d, output %q", code, out)
			}
			if strings.Count(out, "\n") != 1 {
				t.Fatalf("output is not one line: %q", out)
			}
		})
	}
}

// TestRelativeContainerPathAccepted records that the library (v1.1.2) does not
// refuse a relative container path in a mount, so no test may rely on it.
func TestRelativeContainerPathAccepted(t *testing.T) {
	spec := strings.Replace(validSpec, `"containerPath": "/run/y"`, `"containerPath": "run/y"`, 1)
	path := writeSpec(t, t.TempDir(), "spec.json", spec)
	if _, err := checkFile(path); err != nil {
		t.Fatalf("the library now refuses a relative container path (%v): add it to TestInvalidSpecs", err)
	}
}

func TestFileNotLoadedByRuntimes(t *testing.T) {
	path := writeSpec(t, t.TempDir(), "spec.txt", validSpec)
	code, out := runCheck(t, path)
	if code != 1 || !strings.HasPrefix(out, "invalid "+path+": not loaded by runtimes") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

func TestMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.json")
	code, out := runCheck(t, path)
	if code != 1 || !strings.HasPrefix(out, "invalid "+path+": ") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

func TestRequireDevice(t *testing.T) {
	dir := t.TempDir()
	good := writeSpec(t, dir, "good.json", validSpec)
	bad := writeSpec(t, dir, "bad.json", strings.Replace(validSpec, `"uid1-gpu-0"`, `"uid2 gpu-0"`, 1))

	if code, _ := runCheck(t, "-require-device", "gputenancy.io/gpu=uid1-gpu-0", good); code != 0 {
		t.Errorf("defined device: exit %d", code)
	}
	code, out := runCheck(t, "-require-device", "gputenancy.io/gpu=uid1-gpu-0", "-require-device", "gputenancy.io/gpu=uid1-gpu-1", good)
	if code != 1 || !strings.Contains(out, "missing gputenancy.io/gpu=uid1-gpu-1: ") || strings.Contains(out, "missing gputenancy.io/gpu=uid1-gpu-0") {
		t.Errorf("one undefined device: exit %d, output %q", code, out)
	}
	// A device only an invalid file names is not defined.
	code, out = runCheck(t, "-require-device", "gputenancy.io/gpu=uid2-gpu-0", good, bad)
	if code != 1 || !strings.Contains(out, "missing gputenancy.io/gpu=uid2-gpu-0: ") {
		t.Errorf("device of an invalid file: exit %d, output %q", code, out)
	}
	// Same kind, other vendor: not the same device.
	code, _ = runCheck(t, "-require-device", "other.io/gpu=uid1-gpu-0", good)
	if code != 1 {
		t.Errorf("other vendor: exit %d", code)
	}
}

func TestConflictInOneDirectory(t *testing.T) {
	dir := t.TempDir()
	a := writeSpec(t, dir, "a.json", validSpec)
	b := writeSpec(t, dir, "b.json", validSpec)
	code, out := runCheck(t, a, b)
	if code != 1 || !strings.Contains(out, "conflict gputenancy.io/gpu=uid1-gpu-0: defined by "+a+", "+b) {
		t.Fatalf("exit %d, output %q", code, out)
	}
	// In two directories the runtime takes the higher-priority one: no error.
	other := writeSpec(t, t.TempDir(), "a.json", validSpec)
	if code, _ := runCheck(t, a, other); code != 0 {
		t.Fatalf("two directories: exit %d", code)
	}
	// The same file twice is one file.
	if code, _ := runCheck(t, a, a); code != 0 {
		t.Fatalf("same file twice: exit %d", code)
	}
}

func TestUsageErrors(t *testing.T) {
	if code, _ := runCheck(t); code != 2 {
		t.Errorf("no files: exit %d", code)
	}
	path := writeSpec(t, t.TempDir(), "spec.json", validSpec)
	for _, bad := range []string{"uid1-gpu-0", "gputenancy.io=uid1-gpu-0", "gputenancy.io/gpu=uid1 gpu-0", "gputenancy.io/gpu="} {
		if code, _ := runCheck(t, "-require-device", bad, path); code != 2 {
			t.Errorf("-require-device %q: exit %d", bad, code)
		}
	}
	if code, _ := runCheck(t, "-no-such-flag", path); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
}

// A claim's spec names the lowest version that expresses it: 0.5.0 where a device name starts
// with a digit (a claim UID may), 0.3.0 otherwise. 1.1.0 is valid to this library but refused by
// runtimes with an older one.
func TestLowestVersion(t *testing.T) {
	dir := t.TempDir()
	lowest := writeSpec(t, dir, "a.json", validSpec)
	digit := writeSpec(t, dir, "b.json", strings.Replace(strings.Replace(validSpec, `"0.3.0"`, `"0.5.0"`, 1), "uid1", "4ea1", 1))
	newer := writeSpec(t, dir, "c.json", strings.Replace(strings.Replace(validSpec, `"0.3.0"`, `"1.1.0"`, 1), "uid1", "uid2", 1))
	tooLow := writeSpec(t, dir, "d.json", strings.Replace(validSpec, "uid1", "5ea1", 1))
	if code, _ := runCheck(t, "-lowest-version", lowest, digit); code != 0 {
		t.Errorf("the lowest versions refused")
	}
	if code, out := runCheck(t, "-lowest-version", newer); code != 1 || !strings.Contains(out, "not the lowest") {
		t.Errorf("1.1.0 for a 0.3.0 spec: exit %d, %s", code, out)
	}
	if code, _ := runCheck(t, newer); code != 0 {
		t.Errorf("without -lowest-version, 1.1.0 is valid")
	}
	if code, _ := runCheck(t, tooLow); code != 1 {
		t.Errorf("0.3.0 with a device name starting with a digit was accepted")
	}
}
