package nvmlcheck

import (
	"fmt"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// createAt makes a GPU instance of profile ID id at start (or where the driver picks, start < 0)
// and returns it with what it reads back.
func createAt(t *testing.T, d nvml.Device, id, start int) (nvml.GpuInstance, nvml.GpuInstanceInfo) {
	t.Helper()
	info := giProfile(t, d, id)
	var gi nvml.GpuInstance
	var ret nvml.Return
	if start < 0 {
		gi, ret = d.CreateGpuInstance(&info)
	} else {
		placements, r := d.GetGpuInstancePossiblePlacements(&info)
		want(t, "GetGpuInstancePossiblePlacements", r, nvml.SUCCESS)
		p := nvml.GpuInstancePlacement{Start: uint32(start), Size: placements[0].Size}
		gi, ret = d.CreateGpuInstanceWithPlacement(&info, &p)
	}
	if ret != nvml.SUCCESS {
		t.Fatalf("create profile %d at %d: %v", id, start, ret)
	}
	got, ret := gi.GetInfo()
	want(t, "GpuInstance.GetInfo", ret, nvml.SUCCESS)
	if int(got.ProfileId) != id || (start >= 0 && int(got.Placement.Start) != start) {
		t.Fatalf("created profile %d at %d, reads back %+v", id, start, got)
	}
	return gi, got
}

// fullCI makes the compute instance spanning gi (what nvidia-smi's -C and mig-parted make).
func fullCI(t *testing.T, gi nvml.GpuInstance, slices uint32) nvml.ComputeInstance {
	t.Helper()
	for j := 0; j < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; j++ {
		p, ret := gi.GetComputeInstanceProfileInfo(j, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && p.SliceCount == slices {
			ci, ret := gi.CreateComputeInstance(&p)
			want(t, "CreateComputeInstance", ret, nvml.SUCCESS)
			return ci
		}
	}
	t.Fatalf("no compute instance profile of %d slices", slices)
	return nil
}

// `nvidia-smi mig -lgi` on two A100 80GB of one node (NVIDIA/DCGM#138): 1g.10gb at 2:1 and 3:1,
// 2g.20gb at 0:2 and 3g.40gb at 4:4 are GPU instances 9, 10, 3, 2 on GPU 0 and 13, 14, 5, 1 on
// GPU 1. Made with placements, read back through go-nvml and go-nvlib (MIG devices, their
// profiles as the device plugin names them, lookups by UUID), then destroyed.
func TestGpuInstancesOfDcgm138(t *testing.T) {
	reset(t)
	layout := []struct{ id, start int }{{19, 2}, {19, 3}, {14, 0}, {9, 4}}
	// SMs of each, as NVIDIA/mig-parted#97 prints them for an A100 80GB.
	sms := map[string]uint32{"1g.10gb": 14, "2g.20gb": 28, "3g.40gb": 42}
	for gpu, ids := range map[int][]uint32{gpuA10080: {9, 10, 3, 2}, gpuA10080Two: {13, 14, 5, 1}} {
		d := dev(t, gpu)
		var gis []nvml.GpuInstance
		var cis []nvml.ComputeInstance
		for i, l := range layout {
			gi, info := createAt(t, d, l.id, l.start)
			if info.Id != ids[i] {
				t.Errorf("GPU %d: profile %d at %d is GPU instance %d, nvidia-smi printed %d", gpu, l.id, l.start, info.Id, ids[i])
			}
			gis = append(gis, gi)
			cis = append(cis, fullCI(t, gi, giProfile(t, d, l.id).SliceCount))
		}
		// Listed by profile, as nvidia-smi -lgi lists them.
		var listed []uint32
		for _, id := range []int{19, 14, 9} {
			info := giProfile(t, d, id)
			found, ret := d.GetGpuInstances(&info)
			want(t, "GetGpuInstances", ret, nvml.SUCCESS)
			for _, gi := range found {
				i, _ := gi.GetInfo()
				listed = append(listed, i.Id)
			}
		}
		if w := slices.Sorted(slices.Values(ids)); !slices.Equal(slices.Sorted(slices.Values(listed)), w) {
			t.Errorf("GPU %d: GetGpuInstances lists %v, want %v", gpu, listed, w)
		}
		// The MIG devices, as go-nvlib and the device plugin see them.
		nd, err := devlib.NewDevice(d)
		if err != nil {
			t.Fatal(err)
		}
		migs, err := nd.GetMigDevices()
		if err != nil || len(migs) != len(layout) {
			t.Fatalf("GPU %d: go-nvlib GetMigDevices: %d, %v", gpu, len(migs), err)
		}
		for _, m := range migs {
			prof, err := m.GetProfile()
			if err != nil {
				t.Fatalf("GPU %d: go-nvlib MigDevice.GetProfile: %v", gpu, err)
			}
			giID, ret := m.GetGpuInstanceId()
			want(t, "GetGpuInstanceId", ret, nvml.SUCCESS)
			at := slices.Index(ids, uint32(giID))
			if at < 0 {
				t.Errorf("GPU %d: a MIG device of GPU instance %d", gpu, giID)
				continue
			}
			name := map[int]string{19: "1g.10gb", 14: "2g.20gb", 9: "3g.40gb"}[layout[at].id]
			if prof.String() != name {
				t.Errorf("GPU %d: GPU instance %d is %s to go-nvlib, nvidia-smi printed %s", gpu, giID, prof, name)
			}
			attrs, ret := m.GetAttributes()
			want(t, "GetAttributes of a MIG device", ret, nvml.SUCCESS)
			if attrs.MultiprocessorCount != sms[name] {
				t.Errorf("GPU %d: %s has %d SMs, nvidia-smi prints %d", gpu, name, attrs.MultiprocessorCount, sms[name])
			}
			uuid, ret := m.GetUUID()
			want(t, "GetUUID of a MIG device", ret, nvml.SUCCESS)
			again, err := devlib.NewMigDeviceByUUID(uuid)
			if err != nil {
				t.Fatalf("GPU %d: go-nvlib NewMigDeviceByUUID(%s): %v", gpu, uuid, err)
			}
			if p, err := again.GetProfile(); err != nil || p.String() != name {
				t.Errorf("GPU %d: by UUID %s: %v, %v", gpu, uuid, p, err)
			}
		}
		// docs/nvidia.md#mig-changes-through-nvml: a GPU instance is in use while it has compute instances.
		want(t, "destroy a GPU instance with its compute instance", gis[0].Destroy(), nvml.ERROR_IN_USE)
		for i := range gis {
			want(t, "ComputeInstance.Destroy", cis[i].Destroy(), nvml.SUCCESS)
			want(t, "GpuInstance.Destroy", gis[i].Destroy(), nvml.SUCCESS)
		}
		info := giProfile(t, d, 19)
		if left, ret := d.GetGpuInstances(&info); ret != nvml.SUCCESS || len(left) != 0 {
			t.Errorf("GPU %d: %d 1g instances left (%v)", gpu, len(left), ret)
		}
	}
}

// `nvidia-smi mig -cgi 19,19,19,19,19,19,19` on an A100-SXM4-40GB, no placements given
// (rapidsai/dask-cuda#583): "Successfully created GPU instance ID 9 ... 7 ... 8 ... 11 ... 12 ...
// 13 ... 14". Not the creation order, and not the same IDs on every GPU.
func TestGpuInstancesWithoutPlacementOfDaskCuda583(t *testing.T) {
	reset(t)
	d := dev(t, gpuA100Other)
	var got []uint32
	for range 7 {
		_, info := createAt(t, d, 19, -1)
		got = append(got, info.Id)
	}
	if w := []uint32{9, 7, 8, 11, 12, 13, 14}; !slices.Equal(got, w) {
		t.Errorf("seven 1g.5gb instances are %v, nvidia-smi printed %v", got, w)
	}
	info := giProfile(t, d, 19)
	_, ret := d.CreateGpuInstance(&info)
	want(t, "an eighth 1g.5gb", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
}

// Compute instances inside a GPU instance, against nvml.h's return codes: INVALID_ARGUMENT for
// an invalid profile or engine profile, NOT_SUPPORTED "if profile isn't supported" (a 4g
// instance has no 3c, `nvidia-smi mig -lcip`), INSUFFICIENT_RESOURCES when its slices are used.
func TestComputeInstances(t *testing.T) {
	reset(t)
	d := dev(t, gpuH100)
	gi, info := createAt(t, d, 0, -1)
	if info.Placement.Start != 0 || info.Placement.Size != 8 {
		t.Fatalf("7g.80gb at %+v", info.Placement)
	}
	// The MIG user guide's `nvidia-smi mig -lcip` of a 7g instance: 1c, 2c, 3c, 4c and 7g,
	// of 7, 3, 2, 1 and 1 instances.
	wantSlices, wantCount := []uint32{1, 2, 3, 4, 7}, []uint32{7, 3, 2, 1, 1}
	ended := false
	for j := 0; j < nvml.COMPUTE_INSTANCE_PROFILE_COUNT+2; j++ {
		p, ret := gi.GetComputeInstanceProfileInfo(j, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		switch {
		case j < len(wantSlices):
			want(t, fmt.Sprintf("CI profile %d", j), ret, nvml.SUCCESS)
			if p.SliceCount != wantSlices[j] || p.InstanceCount != wantCount[j] || int(p.Id) != j {
				t.Errorf("CI profile %d: %d slices, %d instances, ID %d", j, p.SliceCount, p.InstanceCount, p.Id)
			}
		case ret == nvml.ERROR_INVALID_ARGUMENT:
			ended = true
		case ended || ret != nvml.ERROR_NOT_SUPPORTED:
			t.Errorf("CI profile %d: %v", j, ret)
		}
	}
	if !ended {
		t.Errorf("compute instance profiles never end with INVALID_ARGUMENT")
	}
	_, ret := gi.GetComputeInstanceProfileInfo(0, 1)
	want(t, "engine profile 1", ret, nvml.ERROR_INVALID_ARGUMENT)

	three, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
	four, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 0)
	a, ret := gi.CreateComputeInstance(&three)
	want(t, "a 3c", ret, nvml.SUCCESS)
	b, ret := gi.CreateComputeInstance(&three)
	want(t, "a second 3c", ret, nvml.SUCCESS)
	_, ret = gi.CreateComputeInstance(&four)
	want(t, "a 4c beside two 3c", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	listed, ret := gi.GetComputeInstances(&three)
	want(t, "GetComputeInstances(3c)", ret, nvml.SUCCESS)
	if len(listed) != 2 {
		t.Errorf("%d 3c instances listed", len(listed))
	}
	for _, ci := range listed {
		ci1, _ := ci.GetInfo()
		back, ret := gi.GetComputeInstanceById(int(ci1.Id))
		want(t, "GetComputeInstanceById", ret, nvml.SUCCESS)
		ci2, _ := back.GetInfo()
		if ci2.Id != ci1.Id || ci2.ProfileId != nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE {
			t.Errorf("compute instance %d reads back as %+v", ci1.Id, ci2)
		}
	}
	_, ret = gi.GetComputeInstanceById(6)
	want(t, "GetComputeInstanceById of none", ret, nvml.ERROR_NOT_FOUND)
	want(t, "destroy a 3c", a.Destroy(), nvml.SUCCESS)
	want(t, "destroy a 3c", b.Destroy(), nvml.SUCCESS)
	want(t, "destroy the 7g", gi.Destroy(), nvml.SUCCESS)

	// 4g.40gb at 0 and 3g.40gb at 4: a 4g offers no 3c; full compute instances have the SMs
	// nvidia-smi prints (64 and 60, docs/nvidia.md#mig-geometry).
	g4, _ := createAt(t, d, 5, 0)
	g3, _ := createAt(t, d, 9, 4)
	_, ret = g4.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
	want(t, "a 3c in a 4g", ret, nvml.ERROR_NOT_SUPPORTED)
	notOffered := nvml.ComputeInstanceProfileInfo{Id: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, InstanceCount: 1}
	_, ret = g4.GetComputeInstances(&notOffered)
	want(t, "listing 3c instances of a 4g", ret, nvml.ERROR_NOT_SUPPORTED)
	_, ret = g4.CreateComputeInstance(&notOffered)
	want(t, "creating a 3c in a 4g", ret, nvml.ERROR_NOT_SUPPORTED)
	fullCI(t, g4, 4)
	fullCI(t, g3, 3)
	nd, _ := devlib.NewDevice(d)
	migs, err := nd.GetMigDevices()
	if err != nil || len(migs) != 2 {
		t.Fatalf("go-nvlib GetMigDevices: %d, %v", len(migs), err)
	}
	for _, m := range migs {
		p, err := m.GetProfile()
		attrs, _ := m.GetAttributes()
		sm := map[string]uint32{"4g.40gb": 64, "3g.40gb": 60}
		if err != nil || attrs.MultiprocessorCount != sm[p.String()] {
			t.Errorf("MIG device %v: %d SMs (%v)", p, attrs.MultiprocessorCount, err)
		}
	}
}

// nvml.h: listing, creating and finding GPU instances is NOT_SUPPORTED "if device doesn't have
// MIG mode enabled"; the MIG device count "returns zero if MIG is not supported or enabled".
// Once MIG is on, the same calls work.
func TestWithoutMigMode(t *testing.T) {
	reset(t)
	d := dev(t, gpuMigOff)
	info := giProfile(t, d, 0)
	_, ret := d.GetGpuInstances(&info)
	want(t, "GetGpuInstances", ret, nvml.ERROR_NOT_SUPPORTED)
	_, ret = d.CreateGpuInstance(&info)
	want(t, "CreateGpuInstance", ret, nvml.ERROR_NOT_SUPPORTED)
	_, ret = d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 8})
	want(t, "CreateGpuInstanceWithPlacement", ret, nvml.ERROR_NOT_SUPPORTED)
	_, ret = d.GetGpuInstanceById(0)
	want(t, "GetGpuInstanceById", ret, nvml.ERROR_NOT_SUPPORTED)
	n, ret := d.GetMaxMigDeviceCount()
	want(t, "GetMaxMigDeviceCount", ret, nvml.SUCCESS)
	if n != 0 {
		t.Errorf("%d MIG devices possible with MIG off", n)
	}
	// Placements are listed "regardless of whether MIG is enabled or not" (nvml.h).
	if p, ret := d.GetGpuInstancePossiblePlacements(&info); ret != nvml.SUCCESS || len(p) != 1 {
		t.Errorf("placements of 7g.40gb with MIG off: %v, %v", p, ret)
	}

	activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	want(t, "SetMigMode", ret, nvml.SUCCESS)
	want(t, "SetMigMode's activation status on an idle GPU", activation, nvml.SUCCESS)
	current, pending, ret := d.GetMigMode()
	if ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE || pending != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d pending %d (%v)", current, pending, ret)
	}
	gi, got := createAt(t, d, 0, 0)
	if got.Id != 0 {
		t.Errorf("the whole GPU is GPU instance %d", got.Id)
	}
	want(t, "destroy", gi.Destroy(), nvml.SUCCESS)
	_, ret = d.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	want(t, "SetMigMode off", ret, nvml.SUCCESS)
}
