package nvmlcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// simCtl runs the simulator's control binary next to the library (sim-ctl event ...).
func simCtl(t *testing.T, args ...string) {
	t.Helper()
	path, err := simLib()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(filepath.Dir(path), "sim-ctl"), args...)
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sim-ctl %v: %v: %s", args, err, out)
	}
}

// Event sets as NVIDIA's device plugin and DRA driver use them for health: register the XID and
// ECC events a GPU supports, wait; an XID on a MIG instance comes on its parent GPU with the GPU
// and compute instance IDs; an event of an unregistered GPU or one from before the set was
// created is not delivered; nothing to deliver is TIMEOUT.
func TestEventSetsDeliverXidAndEccEvents(t *testing.T) {
	reset(t)
	simCtl(t, "event", "--gpu", "1", "--xid", "79") // before the set: never delivered
	set, ret := lib.EventSetCreate()
	want(t, "EventSetCreate", ret, nvml.SUCCESS)
	defer set.Free()
	d0 := dev(t, 0)
	supported, ret := d0.GetSupportedEventTypes()
	want(t, "GetSupportedEventTypes", ret, nvml.SUCCESS)
	mask := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
	if supported&mask != mask {
		t.Fatalf("supported events %#x lack XID and double-bit ECC", supported)
	}
	want(t, "RegisterEvents(GPU 0)", d0.RegisterEvents(mask, set), nvml.SUCCESS)
	_, ret = set.Wait(10)
	want(t, "Wait with nothing to deliver", ret, nvml.ERROR_TIMEOUT)

	simCtl(t, "event", "--gpu", "1", "--xid", "48") // GPU 1 is not registered
	simCtl(t, "event", "--gpu", "0", "--xid", "79")
	simCtl(t, "event", "--gpu", "0", "--ecc-uncorrectable")
	e, ret := set.Wait(1000)
	want(t, "Wait", ret, nvml.SUCCESS)
	if i, _ := e.Device.GetIndex(); e.EventType != nvml.EventTypeXidCriticalError || e.EventData != 79 || i != 0 {
		t.Errorf("first event: type %#x data %d GPU %d, want XID 79 on GPU 0", e.EventType, e.EventData, i)
	}
	if e.GpuInstanceId != 0xFFFFFFFF || e.ComputeInstanceId != 0xFFFFFFFF {
		t.Errorf("an event of the whole GPU has instance IDs %d/%d, want 0xFFFFFFFF", e.GpuInstanceId, e.ComputeInstanceId)
	}
	e, ret = set.Wait(1000)
	want(t, "Wait", ret, nvml.SUCCESS)
	if e.EventType != nvml.EventTypeDoubleBitEccError {
		t.Errorf("second event: type %#x, want double-bit ECC", e.EventType)
	}
	_, ret = set.Wait(10)
	want(t, "Wait after both", ret, nvml.ERROR_TIMEOUT)

	// MIG: the instance's XID carries its IDs; its MIG device cannot register itself.
	m := dev(t, gpuA10080)
	want(t, "RegisterEvents(A100)", m.RegisterEvents(mask, set), nvml.SUCCESS)
	gi, gii := createAt(t, m, 19, 3) // 1g.10gb
	ci := fullCI(t, gi, 1)
	cii, _ := ci.GetInfo()
	simCtl(t, "event", "--gpu", strconv.Itoa(gpuA10080), "--start", "3", "--xid", "31")
	e, ret = set.Wait(1000)
	want(t, "Wait (MIG)", ret, nvml.SUCCESS)
	if e.EventData != 31 || e.GpuInstanceId != gii.Id || e.ComputeInstanceId != cii.Id {
		t.Errorf("MIG event: XID %d on %d/%d, want 31 on %d/%d", e.EventData, e.GpuInstanceId, e.ComputeInstanceId, gii.Id, cii.Id)
	}
	mig, ret := m.GetMigDeviceHandleByIndex(0)
	want(t, "GetMigDeviceHandleByIndex", ret, nvml.SUCCESS)
	want(t, "RegisterEvents(MIG device)", mig.RegisterEvents(mask, set), nvml.ERROR_NOT_SUPPORTED)
}
