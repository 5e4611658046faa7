package nvmlcheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Devices by PCI bus ID in every form nvml.h documents for nvmlDeviceGetHandleByPciBusId_v2
// (`%x:%x:%x.%x`, `%x:%x:%x`, `%x:%x.%x`, hexadecimal), as NVML itself (busId, busIdLegacy)
// and go-nvlib (`0000:18:00.0`, what the device plugin and GFD print) write them, and by UUID.
func TestDevicesByPciBusIdAndUuid(t *testing.T) {
	reset(t)
	for gpu := 0; gpu < gpuCount; gpu++ {
		d := dev(t, gpu)
		pci, ret := d.GetPciInfo()
		want(t, "GetPciInfo", ret, nvml.SUCCESS)
		nd, err := devlib.NewDevice(d)
		if err != nil {
			t.Fatal(err)
		}
		short, err := nd.GetPCIBusID()
		if err != nil {
			t.Fatal(err)
		}
		busID, legacy := cString(pci.BusId[:]), cString(pci.BusIdLegacy[:])
		if busID != fmt.Sprintf("%08X:%02X:%02X.0", pci.Domain, pci.Bus, pci.Device) ||
			legacy != fmt.Sprintf("%04X:%02X:%02X.0", pci.Domain, pci.Bus, pci.Device) {
			t.Errorf("GPU %d: busId %q, busIdLegacy %q: not nvml.h's formats", gpu, busID, legacy)
		}
		if pci.PciDeviceId&0xFFFF != 0x10DE {
			t.Errorf("GPU %d: PCI ID %#x is not NVIDIA's", gpu, pci.PciDeviceId)
		}
		bus := fmt.Sprintf("%02x:%02x", pci.Bus, pci.Device)
		for _, form := range []string{busID, legacy, short, strings.ToLower(busID), "0000:" + bus, bus + ".0"} {
			found, ret := lib.DeviceGetHandleByPciBusId(form)
			want(t, fmt.Sprintf("GPU %d by bus ID %q", gpu, form), ret, nvml.SUCCESS)
			if ret != nvml.SUCCESS {
				continue
			}
			if i, _ := found.GetIndex(); i != gpu {
				t.Errorf("bus ID %q is GPU %d, not %d", form, i, gpu)
			}
		}
		uuid, ret := d.GetUUID()
		want(t, "GetUUID", ret, nvml.SUCCESS)
		found, ret := lib.DeviceGetHandleByUUID(uuid)
		want(t, "DeviceGetHandleByUUID", ret, nvml.SUCCESS)
		if i, _ := found.GetIndex(); ret == nvml.SUCCESS && i != gpu {
			t.Errorf("UUID %s is GPU %d, not %d", uuid, i, gpu)
		}
		if byUUID, err := devlib.NewDeviceByUUID(uuid); err != nil {
			t.Errorf("go-nvlib NewDeviceByUUID(%s): %v", uuid, err)
		} else if name, _ := byUUID.GetName(); name != names[gpu] {
			t.Errorf("UUID %s names %q", uuid, name)
		}
	}
	// nvml.h: NOT_FOUND "if pciBusId does not match a valid device", INVALID_ARGUMENT "if
	// pciBusId is invalid"; the same for UUIDs.
	_, ret := lib.DeviceGetHandleByPciBusId("0000:99:00.0")
	want(t, "a bus ID with no GPU", ret, nvml.ERROR_NOT_FOUND)
	_, ret = lib.DeviceGetHandleByPciBusId("not a bus id")
	want(t, "not a bus ID", ret, nvml.ERROR_INVALID_ARGUMENT)
	_, ret = lib.DeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
	want(t, "a UUID of no GPU", ret, nvml.ERROR_NOT_FOUND)
}
