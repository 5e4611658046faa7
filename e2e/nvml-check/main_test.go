package nvmlcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The simulated node, set up the way the agent's tests set it up (e2e/nvml-sim/README.md): a
// config in GPU_TENANCY_SIM_CONFIG, its state next to it. The library reads the config's path
// once per process, so every test shares this node; reset() starts it over.
const config = `gpus:
- {pciDeviceId: "0x20B010DE", count: 2, mig: true}  # 0, 1: A100-SXM4-40GB
- {pciDeviceId: "0x20B210DE", count: 2, mig: true}  # 2, 3: A100-SXM4-80GB
- {model: "NVIDIA H100 80GB HBM3", mig: true}       # 4
- {pciDeviceId: "0x232110DE", mig: true}            # 5: H100 NVL
- {pciDeviceId: "0x233510DE", mig: true}            # 6: H200
- {pciDeviceId: "0x290110DE", mig: true}            # 7: B200
- {pciDeviceId: "0x20B010DE"}                       # 8: A100-SXM4-40GB, MIG off
`

const (
	gpuA100      = 0
	gpuA100Other = 1
	gpuA10080    = 2
	gpuA10080Two = 3
	gpuH100      = 4
	gpuH100NVL   = 5
	gpuH200      = 6
	gpuB200      = 7
	gpuMigOff    = 8
	gpuCount     = 9
)

var (
	lib    nvml.Interface
	devlib device.Interface
	state  string
)

// simLib is the built simulator: NVML_SIM_LIB, else cargo's debug output of this checkout.
func simLib() (string, error) {
	if p := os.Getenv("NVML_SIM_LIB"); p != "" {
		return filepath.Abs(p)
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = "../../target"
	}
	p, err := filepath.Abs(filepath.Join(target, "debug", "libnvidia_ml_sim.so"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %w (build it with `cargo build -p nvml-sim`, or set NVML_SIM_LIB)", p, err)
	}
	return p, nil
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	path, err := simLib()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-check:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "nvml-check-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-check:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "sim.yaml")
	state = filepath.Join(dir, "sim.state.json")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "nvml-check:", err)
		return 2
	}
	os.Setenv("GPU_TENANCY_SIM_CONFIG", cfg)
	os.Setenv("GPU_TENANCY_SIM_STATE", state)

	// What NVIDIA's tools do: go-nvml's dlopen of the library by path, then nvmlInit.
	lib = nvml.New(nvml.WithLibraryPath(path))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		fmt.Fprintf(os.Stderr, "nvml-check: nvmlInit of %s: %v\n", path, ret)
		return 2
	}
	defer lib.Shutdown()
	devlib = device.New(lib)
	return m.Run()
}

// reset starts the node over from its config (the simulator recreates a deleted state file).
func reset(t *testing.T) {
	t.Helper()
	if err := os.Remove(state); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

func dev(t *testing.T, i int) nvml.Device {
	t.Helper()
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
	}
	return d
}

// want fails the test unless ret is the code nvml.h documents for the case.
func want(t *testing.T, what string, ret, code nvml.Return) {
	t.Helper()
	if ret != code {
		t.Errorf("%s: %v (%d), nvml.h documents %v (%d)", what, ret, int32(ret), code, int32(code))
	}
}

// giProfile is the profile whose ID (what nvidia-smi prints) is id, found by enumerating the
// NVML enum the way go-nvlib does.
func giProfile(t *testing.T, d nvml.Device, id int) nvml.GpuInstanceProfileInfo {
	t.Helper()
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := d.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && int(info.Id) == id {
			return info
		}
	}
	t.Fatalf("no GPU instance profile with ID %d", id)
	return nvml.GpuInstanceProfileInfo{}
}
