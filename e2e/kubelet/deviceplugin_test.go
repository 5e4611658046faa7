package main

import (
	"reflect"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
)

func parse(t *testing.T, s string) *pluginConfig {
	t.Helper()
	var c pluginConfig
	if err := yaml.Unmarshal([]byte(s), &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// names gives each advertised resource's name and IDs, joined, for comparison.
func names(rs []resource) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		out[r.name] = strings.Join(r.ids, ",")
	}
	return out
}

// The configs the controller renders (core/src/device_plugin.rs NodeConfig::render), each with
// the resources NVIDIA's plugin advertises for it.
func TestAdvertisedPerRenderedConfig(t *testing.T) {
	gpus := []string{"GPU-b", "GPU-a"}
	migGPUs := []string{"GPU-m"}
	mig := map[string]string{"MIG-1": "3g.40gb", "MIG-2": "3g.40gb", "MIG-3": "1g.10gb"}
	for _, tc := range []struct {
		name, config string
		want         map[string]string
	}{
		{"exclusive", "version: v1\nflags: {migStrategy: none}\n",
			map[string]string{"nvidia.com/gpu": "GPU-a,GPU-b,GPU-m"}},
		{"mig-mixed", "version: v1\nflags: {migStrategy: mixed}\n",
			map[string]string{"nvidia.com/gpu": "GPU-a,GPU-b", "nvidia.com/mig-3g.40gb": "MIG-1,MIG-2", "nvidia.com/mig-1g.10gb": "MIG-3"}},
		{"time-slicing-2", "version: v1\nflags: {migStrategy: none}\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			map[string]string{"nvidia.com/gpu.shared": "GPU-a::0,GPU-a::1,GPU-b::0,GPU-b::1,GPU-m::0,GPU-m::1"}},
		{"mps-2", "version: v1\nflags: {migStrategy: none}\nsharing:\n  mps:\n    renameByDefault: true\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			map[string]string{"nvidia.com/gpu.shared": "GPU-a::0,GPU-a::1,GPU-b::0,GPU-b::1,GPU-m::0,GPU-m::1"}},
		{"mig-mixed.time-slicing-2", "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			map[string]string{"nvidia.com/gpu.shared": "GPU-a::0,GPU-a::1,GPU-b::0,GPU-b::1", "nvidia.com/mig-3g.40gb": "MIG-1,MIG-2", "nvidia.com/mig-1g.10gb": "MIG-3"}},
	} {
		rs, _, err := advertised(parse(t, tc.config), gpus, migGPUs, mig)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := names(rs); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: advertised %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRefusedConfigs(t *testing.T) {
	for _, config := range []string{
		"version: v2\n",
		"version: v1\nimex:\n  channelIDs: [1]\n",
		"version: v1\nflags: {migStrategy: single}\n",
		"version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 1}]\n",
	} {
		if _, _, err := advertised(parse(t, config), []string{"GPU-a"}, nil, nil); err == nil {
			t.Errorf("%q was accepted", config)
		}
	}
}

func TestAllocateGivesUUIDsAndRefusesTwoReplicas(t *testing.T) {
	r := resource{name: "nvidia.com/gpu.shared", ids: []string{"GPU-a::0", "GPU-a::1"}, shared: true}
	devs := map[string]*pluginapi.Device{"GPU-a::0": {ID: "GPU-a::0"}, "GPU-a::1": {ID: "GPU-a::1"}}
	one := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::1"}}}}
	resp, err := allocate(r, true)(one, devs)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-a" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want GPU-a", got)
	}
	two := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::0", "GPU-a::1"}}}}
	if _, err := allocate(r, true)(two, devs); err == nil {
		t.Error("two replicas for one container were allocated under failRequestsGreaterThanOne")
	}
	if _, err := allocate(r, false)(two, devs); err != nil {
		t.Errorf("two replicas without failRequestsGreaterThanOne: %v", err)
	}
}
