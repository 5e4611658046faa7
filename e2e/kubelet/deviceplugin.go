package main

// A device plugin for the real kubelet's device manager that advertises what NVIDIA's
// k8s-device-plugin (v0.20) advertises for a node's config, built on the kubelet's own test stub
// (k8s.io/kubernetes pkg/kubelet/cm/devicemanager/plugin/v1beta1 NewDevicePluginStub): NVIDIA's
// plugin needs NVML and cannot be built here.
//
// What it reproduces of NVIDIA's plugin, from its config file (the one the controller renders
// into the device plugin's ConfigMap for the node) and the node's devices given on the command
// line:
//   - the resource names: `nvidia.com/gpu` per whole GPU, under `migStrategy: mixed`
//     `nvidia.com/mig-<profile>` per MIG device and nothing for a MIG-enabled GPU, under `none`
//     every GPU whole (MIG-enabled ones too) and no MIG device (internal/rm/device_map.go);
//   - the device IDs: `GPU-<uuid>`, `MIG-<uuid>`, and for a resource the config shares
//     (`sharing.timeSlicing` or `sharing.mps`) `<id>::<n>` for each of its `replicas`, renamed to
//     `rename` or, with `renameByDefault`, `<name>.shared` (internal/rm/device_map.go
//     updateDeviceMapWithReplicas, NewAnnotatedID);
//   - the refusals at start of an unknown version, an IMEX channel list other than [] or [0] (the
//     config of a node no plan governs), and fewer than 2 replicas;
//   - one socket per resource, `nvidia-<name>.sock` in the kubelet's device-plugin directory, and
//     registration again when the kubelet restarts (the stub's own watch);
//   - Allocate: `failRequestsGreaterThanOne` refuses more than one replica per container, and the
//     container gets `NVIDIA_VISIBLE_DEVICES` with the devices' UUIDs, the `::<n>` dropped (the
//     default `deviceListStrategy: envvar`, `deviceIDStrategy: uuid`; internal/plugin/server.go).
//
// What it does not: read NVML (the devices come from the flags, read once at start, as NVIDIA's
// plugin reads them once at start), health checks (every device stays Healthy), the `single` MIG
// strategy, the `MIG_STRATEGY` environment override, CDI annotations and other device list
// strategies, device nodes and mounts, GetPreferredAllocation, the MPS daemon and its environment,
// and config-manager's switch between configs by node label.
//
//	kubelet device-plugin --plugin-dir DIR --config FILE [--gpus GPU-...,...]
//	        [--mig-gpus GPU-...,...] [--mig-devices MIG-...=PROFILE,...]

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	stub "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"sigs.k8s.io/yaml"
)

// pluginConfig is the part of NVIDIA's config file (api/config/v1) this plugin reads.
type pluginConfig struct {
	Version string `json:"version"`
	Flags   struct {
		MigStrategy *string `json:"migStrategy"`
	} `json:"flags"`
	Sharing struct {
		TimeSlicing *sharing `json:"timeSlicing"`
		MPS         *sharing `json:"mps"`
	} `json:"sharing"`
	Imex struct {
		ChannelIDs []int `json:"channelIDs"`
	} `json:"imex"`
}

type sharing struct {
	RenameByDefault            bool `json:"renameByDefault"`
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne"`
	Resources                  []struct {
		Name     string `json:"name"`
		Rename   string `json:"rename"`
		Replicas int    `json:"replicas"`
	} `json:"resources"`
}

// resource is one resource name the plugin advertises, with its device IDs.
type resource struct {
	name   string
	ids    []string
	shared bool // replicas: Allocate holds failRequestsGreaterThanOne
}

// split splits a comma-separated flag value, dropping empty items.
func split(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// advertised computes the resources NVIDIA's plugin advertises for config `c` on a node whose
// whole GPUs are `gpus`, MIG-enabled GPUs `migGPUs` and MIG devices `migDevices` (UUID to profile).
func advertised(c *pluginConfig, gpus, migGPUs []string, migDevices map[string]string) ([]resource, *sharing, error) {
	if c.Version != "" && c.Version != "v1" {
		return nil, nil, fmt.Errorf("unknown config version %q", c.Version)
	}
	// main.go validateFlags -> api/config/v1/imex.go AssertChannelIDsValid: the plugin exits,
	// advertising nothing (the config of a node no plan governs relies on it).
	if ids := c.Imex.ChannelIDs; !(len(ids) == 0 || (len(ids) == 1 && ids[0] == 0)) {
		return nil, nil, fmt.Errorf("invalid IMEX channel IDs: channelIDs must be [] or [0]; found %v", ids)
	}
	strategy := "none"
	if c.Flags.MigStrategy != nil {
		strategy = *c.Flags.MigStrategy
	}
	byName := map[string][]string{}
	switch strategy {
	case "none":
		byName["nvidia.com/gpu"] = append(append([]string{}, gpus...), migGPUs...)
	case "mixed":
		byName["nvidia.com/gpu"] = append([]string{}, gpus...)
		for id, profile := range migDevices {
			name := "nvidia.com/mig-" + profile
			byName[name] = append(byName[name], id)
		}
	default:
		return nil, nil, fmt.Errorf("migStrategy %q is not reproduced here (none and mixed are)", strategy)
	}
	sh := c.Sharing.TimeSlicing
	if sh == nil || len(sh.Resources) == 0 {
		sh = c.Sharing.MPS
	}
	if sh != nil && len(sh.Resources) == 0 {
		sh = nil
	}
	var out []resource
	for name, ids := range byName {
		if len(ids) == 0 {
			continue
		}
		sort.Strings(ids)
		r := resource{name: name, ids: ids}
		if sh != nil {
			for _, s := range sh.Resources {
				if s.Name != name {
					continue
				}
				if s.Replicas < 2 {
					return nil, nil, fmt.Errorf("sharing: replicas of %s must be >= 2, not %d", name, s.Replicas)
				}
				var replicas []string
				for _, id := range ids {
					for n := 0; n < s.Replicas; n++ {
						replicas = append(replicas, fmt.Sprintf("%s::%d", id, n))
					}
				}
				r.ids, r.shared = replicas, true
				switch {
				case s.Rename != "":
					r.name = s.Rename
				case sh.RenameByDefault:
					r.name = name + ".shared"
				}
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, sh, nil
}

// allocate answers the kubelet's Allocate as NVIDIA's plugin does with its default strategies.
func allocate(r resource, failGreaterThanOne bool) func(*pluginapi.AllocateRequest, map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	return func(req *pluginapi.AllocateRequest, devs map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
		var resp pluginapi.AllocateResponse
		for _, c := range req.ContainerRequests {
			if r.shared && failGreaterThanOne && len(c.DevicesIds) > 1 {
				return nil, fmt.Errorf("request for '%s: %d' too large: maximum request size for shared resources is 1", r.name, len(c.DevicesIds))
			}
			var uuids []string
			for _, id := range c.DevicesIds {
				if _, ok := devs[id]; !ok {
					return nil, fmt.Errorf("invalid allocation request for '%s': unknown device: %s", r.name, id)
				}
				uuid, _, _ := strings.Cut(id, "::")
				uuids = append(uuids, uuid)
			}
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
				Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ",")},
			})
		}
		return &resp, nil
	}
}

func runDevicePlugin(args []string) error {
	fs := flag.NewFlagSet("device-plugin", flag.ContinueOnError)
	dir := fs.String("plugin-dir", "", "the kubelet's device-plugin directory (<root-dir>/device-plugins)")
	config := fs.String("config", "", "NVIDIA's device plugin config file for this node (as the controller renders it)")
	gpus := fs.String("gpus", "", "the UUIDs of the node's GPUs without MIG mode, comma-separated")
	migGPUs := fs.String("mig-gpus", "", "the UUIDs of the node's MIG-enabled GPUs, comma-separated")
	migDevices := fs.String("mig-devices", "", "the node's MIG devices as UUID=PROFILE, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *config == "" {
		return fmt.Errorf("--plugin-dir and --config are required")
	}
	raw, err := os.ReadFile(*config)
	if err != nil {
		return err
	}
	var c pluginConfig
	if err := yaml.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("parsing %s: %w", *config, err)
	}
	mig := map[string]string{}
	for _, d := range split(*migDevices) {
		uuid, profile, ok := strings.Cut(d, "=")
		if !ok {
			return fmt.Errorf("--mig-devices: %q is not UUID=PROFILE", d)
		}
		mig[uuid] = profile
	}
	resources, sh, err := advertised(&c, split(*gpus), split(*migGPUs), mig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.FromContext(ctx)
	kubeletSocket := filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket))
	var stubs []*stub.Stub
	for _, r := range resources {
		devs := make([]*pluginapi.Device, 0, len(r.ids))
		for _, id := range r.ids {
			devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		}
		_, short, _ := strings.Cut(r.name, "/")
		s := stub.NewDevicePluginStub(logger, devs, filepath.Join(*dir, "nvidia-"+short+".sock"), r.name, false, false)
		s.SetAllocFunc(allocate(r, sh != nil && sh.FailRequestsGreaterThanOne))
		if err := s.Start(ctx); err != nil {
			return fmt.Errorf("serving %s: %w", r.name, err)
		}
		if err := s.Register(ctx, kubeletSocket, r.name, ""); err != nil {
			return fmt.Errorf("registering %s with the kubelet on %s: %w", r.name, kubeletSocket, err)
		}
		fmt.Fprintf(os.Stderr, "kubelet device-plugin: registered %s with %d devices: %s\n", r.name, len(r.ids), strings.Join(r.ids, ","))
		// Registers again whenever the kubelet restarts (it makes its socket anew).
		go s.Watch(ctx, kubeletSocket, r.name, "")
		stubs = append(stubs, s)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	for _, s := range stubs {
		_ = s.Stop(logger)
	}
	return nil
}
