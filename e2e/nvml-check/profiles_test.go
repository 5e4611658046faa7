package nvmlcheck

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// The names nvidia-smi prints for these parts: "NVIDIA A100-SXM4-80GB" in DataDog/datadog-agent#33120,
// the others as NVIDIA/mig-parted#120 (H200), #166 (B200) and the MIG user guide print them.
var names = map[int]string{
	gpuA100: "NVIDIA A100-SXM4-40GB", gpuA100Other: "NVIDIA A100-SXM4-40GB",
	gpuA10080: "NVIDIA A100-SXM4-80GB", gpuA10080Two: "NVIDIA A100-SXM4-80GB",
	gpuH100: "NVIDIA H100 80GB HBM3", gpuH100NVL: "NVIDIA H100 NVL", gpuH200: "NVIDIA H200",
	gpuB200: "NVIDIA B200", gpuMigOff: "NVIDIA A100-SXM4-40GB",
}

// go-nvlib walks the node as the device plugin and GPU feature discovery do.
func TestDevicesAsGoNvlibSeesThem(t *testing.T) {
	reset(t)
	n, ret := lib.DeviceGetCount()
	want(t, "DeviceGetCount", ret, nvml.SUCCESS)
	if n != gpuCount {
		t.Fatalf("%d devices, the config has %d", n, gpuCount)
	}
	seen := 0
	err := devlib.VisitDevices(func(i int, d device.Device) error {
		seen++
		name, ret := d.GetName()
		if ret != nvml.SUCCESS || name != names[i] {
			return fmt.Errorf("GPU %d: name %q (%v), nvidia-smi prints %q", i, name, ret, names[i])
		}
		capable, err := d.IsMigCapable()
		if err != nil || !capable {
			return fmt.Errorf("GPU %d: MIG capable %v, %v", i, capable, err)
		}
		enabled, err := d.IsMigEnabled()
		if err != nil || enabled != (i != gpuMigOff) {
			return fmt.Errorf("GPU %d: MIG enabled %v, %v", i, enabled, err)
		}
		migs, err := d.GetMigDevices()
		if err != nil || len(migs) != 0 {
			return fmt.Errorf("GPU %d: MIG devices %v, %v on a fresh node", i, migs, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != gpuCount {
		t.Fatalf("go-nvlib visited %d devices", seen)
	}
}

// published is what NVIDIA printed for the model of each simulated GPU.
func published(t *testing.T) map[int]Published {
	t.Helper()
	out := map[int]Published{gpuH100: H10080GB, gpuA10080: A10080GB}
	for gpu, f := range map[int][3]string{
		gpuA100:    {"A100-40GB", "a100-40gb-lgip.txt", "a100-40gb-lgipp.txt"},
		gpuH100NVL: {"H100-NVL", "h100-nvl-lgip.txt", "h100-nvl-lgipp.txt"},
		gpuH200:    {"H200", "h200-lgip.txt", ""},
		gpuB200:    {"B200", "b200-lgip.txt", ""},
	} {
		p, err := FromFiles(f[0], f[1], f[2], gpu != gpuB200)
		if err != nil {
			t.Fatal(err)
		}
		out[gpu] = p
	}
	return out
}

// gib is memory as nvidia-smi prints it: GiB with two decimals, halves to even as C's printf
// rounds them (9856 MiB is 9.62, 47488 MiB 46.38 in the published outputs); strconv does the same.
func gib(mb uint64) string {
	return strconv.FormatFloat(float64(mb)/1024, 'f', 2, 64)
}

// Every GPU instance profile, as go-nvml reads it and go-nvlib names it, against nvidia-smi.
func TestProfilesMatchNvidiaSmi(t *testing.T) {
	reset(t)
	for gpu, p := range published(t) {
		d := dev(t, gpu)
		byID := map[int]nvml.GpuInstanceProfileInfo{}
		nameOf := map[int]string{}
		for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
			info, ret := d.GetGpuInstanceProfileInfo(i)
			if ret != nvml.SUCCESS {
				continue
			}
			byID[int(info.Id)] = info
			v2, ret := d.GetGpuInstanceProfileInfoV(i).V2()
			want(t, fmt.Sprintf("%s: GetGpuInstanceProfileInfoV(%d)", p.Model, i), ret, nvml.SUCCESS)
			nameOf[int(info.Id)] = strings.TrimPrefix(cString(v2.Name[:]), "MIG ")
		}
		// go-nvlib's names, from profile IDs and memory as the device plugin computes them.
		profiles, err := devlib.NewDevice(d)
		if err != nil {
			t.Fatal(err)
		}
		migProfiles, err := profiles.GetMigProfiles()
		if err != nil {
			t.Fatalf("%s: go-nvlib GetMigProfiles: %v", p.Model, err)
		}
		// A device's list repeats a name when two compute-instance enums have the same slices
		// (1_SLICE and 1_SLICE_REV1; go-nvlib's node-wide VisitMigProfiles keeps one).
		var whole []string
		for _, m := range migProfiles {
			if i := m.GetInfo(); i.C == i.G && !slices.Contains(whole, m.String()) {
				whole = append(whole, m.String())
			}
		}
		for _, r := range p.Rows {
			info, ok := byID[r.ID]
			where := fmt.Sprintf("%s (%s) %s", p.Model, p.Source, r.Name)
			if !ok {
				t.Errorf("%s: no profile with ID %d", where, r.ID)
				continue
			}
			if nameOf[r.ID] != r.Name {
				t.Errorf("%s: the driver names it %q", where, nameOf[r.ID])
			}
			if !slices.Contains(whole, r.Name) {
				t.Errorf("%s: go-nvlib names the profiles %v", where, whole)
			}
			if int(info.InstanceCount) != r.Total {
				t.Errorf("%s: %d instances, nvidia-smi prints %d", where, info.InstanceCount, r.Total)
			}
			if p.MemoryChecked && gib(info.MemorySizeMB) != r.MemoryGiB {
				t.Errorf("%s: %d MiB (%s GiB), nvidia-smi prints %s", where, info.MemorySizeMB, gib(info.MemorySizeMB), r.MemoryGiB)
			}
			if int(info.MultiprocessorCount) != r.SM {
				t.Errorf("%s: %d SMs, nvidia-smi prints %d", where, info.MultiprocessorCount, r.SM)
			}
			if info.IsP2pSupported != 0 {
				t.Errorf("%s: P2P supported, nvidia-smi prints No", where)
			}
			got := [5]int{int(info.DecoderCount), int(info.EncoderCount), int(info.CopyEngineCount), int(info.JpegCount), int(info.OfaCount)}
			pub := [5]int{r.DEC, r.ENC, r.CE, r.JPEG, r.OFA}
			if r.HasDecoders && (got[0] != pub[0] || got[1] != pub[1]) {
				t.Errorf("%s: DEC, ENC %v, nvidia-smi prints %v", where, got[:2], pub[:2])
			}
			if r.HasEngines && (got[2] != pub[2] || got[3] != pub[3] || got[4] != pub[4]) {
				t.Errorf("%s: CE, JPEG, OFA %v, nvidia-smi prints %v", where, got[2:], pub[2:])
			}
		}
		if p.Complete {
			// One name per profile: an output of several GPUs lists each once per GPU.
			var listed []string
			for _, r := range p.Rows {
				if !slices.Contains(listed, r.Name) {
					listed = append(listed, r.Name)
				}
			}
			slices.Sort(listed)
			slices.Sort(whole)
			if !slices.Equal(listed, whole) {
				t.Errorf("%s: go-nvlib finds profiles %v, nvidia-smi lists %v", p.Model, whole, listed)
			}
		}
		for _, r := range p.Placements {
			info := byID[r.ID]
			got, ret := d.GetGpuInstancePossiblePlacements(&info)
			want(t, fmt.Sprintf("%s: placements of profile %d", p.Model, r.ID), ret, nvml.SUCCESS)
			var starts []int
			for _, pl := range got {
				starts = append(starts, int(pl.Start))
				if int(pl.Size) != r.Size {
					t.Errorf("%s profile %d: placement %v, nvidia-smi prints size %d", p.Model, r.ID, pl, r.Size)
				}
			}
			slices.Sort(starts)
			if !slices.Equal(starts, r.Starts) {
				t.Errorf("%s profile %d: placements at %v, nvidia-smi prints %v", p.Model, r.ID, starts, r.Starts)
			}
		}
		if len(p.Placements) > 0 && len(p.Placements) != len(byID) {
			t.Errorf("%s: %d profiles, nvidia-smi -lgipp lists %d", p.Model, len(byID), len(p.Placements))
		}
	}
}

// nvml.h: enumerate GPU instance profiles "by invoking it on profile values starting from 0,
// until the API returns NVML_ERROR_INVALID_ARGUMENT"; NOT_SUPPORTED "if profile isn't supported"
// (NVML_GPU_INSTANCE_PROFILE_8_SLICE on these parts).
func TestProfileEnumerationEndsWithInvalidArgument(t *testing.T) {
	reset(t)
	for gpu := 0; gpu < gpuCount; gpu++ {
		d := dev(t, gpu)
		ended, found := false, 0
		for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT+4; i++ {
			_, ret := d.GetGpuInstanceProfileInfo(i)
			switch {
			case ret == nvml.ERROR_INVALID_ARGUMENT:
				ended = true
			case ended:
				t.Errorf("GPU %d: profile %d answers %v after the enum ended", gpu, i, ret)
			case ret == nvml.SUCCESS:
				found++
			case ret != nvml.ERROR_NOT_SUPPORTED:
				t.Errorf("GPU %d: profile %d: %v", gpu, i, ret)
			}
		}
		if !ended || found != 7 {
			t.Errorf("GPU %d: %d profiles, enumeration ended: %v", gpu, found, ended)
		}
		_, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_8_SLICE)
		want(t, fmt.Sprintf("GPU %d: the 8_SLICE profile", gpu), ret, nvml.ERROR_NOT_SUPPORTED)
		_, ret = d.GetGpuInstanceProfileInfoV(nvml.GPU_INSTANCE_PROFILE_COUNT).V2()
		want(t, fmt.Sprintf("GPU %d: V past the enum", gpu), ret, nvml.ERROR_INVALID_ARGUMENT)
	}
}
