package main

// A CRI runtime for a real kubelet on a machine without containers: the CRI API's own fake
// runtime (k8s.io/cri-client pkg/fake, the kubelet's test double) served on a unix socket, with
// CreateContainer resolving the container's CDI devices the way containerd does, with the CDI
// library's cache over the runtime's spec directory: a device no valid spec defines fails the
// container ("unresolvable CDI devices"), as it would in production. The CDI edits are applied
// to the container's OCI spec and its createRuntime hooks run as runc runs them (hooks.go): a
// failing hook fails the container's creation. Device nodes are not injected (this machine has
// no GPU device nodes to stat); what each container was given is appended to the record file,
// one JSON object a line, for the tests to read: its ID, its CDI devices, the environment their
// specs set, the environment the kubelet set (a device plugin's Allocate answer among it), and
// the hooks run.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// cdiRuntime is the fake runtime with CreateContainer resolving CDI devices.
type cdiRuntime struct {
	*fake.RemoteRuntime
	cdiDir  string
	record  string
	bundles string
	mu      sync.Mutex
}

// created is one container as the runtime created it.
type created struct {
	ID         string   `json:"id"`
	Pod        string   `json:"pod"`
	Namespace  string   `json:"namespace"`
	Container  string   `json:"container"`
	CDIDevices []string `json:"cdiDevices"`
	Env        []string `json:"env"`
	// ContainerEnv is the container's own environment as the kubelet sent it (KEY=VALUE).
	ContainerEnv []string `json:"containerEnv"`
	// Hooks are the createRuntime hooks run, in order.
	Hooks []ranHook `json:"hooks"`
}

func (r *cdiRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	var names []string
	for _, d := range req.GetConfig().GetCDIDevices() {
		names = append(names, d.GetName())
	}
	edits, err := r.resolve(names)
	if err != nil {
		return nil, err
	}
	spec := baseSpec(req.GetConfig())
	if err := edits.Apply(spec); err != nil {
		return nil, fmt.Errorf("failed to inject CDI devices: %w", err)
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	hooks, err := createRuntimeHooks(spec, resp.GetContainerId(), r.bundles)
	if err != nil {
		// runc destroys a container whose createRuntime hook failed; the creation fails.
		_, _ = r.RemoteRuntime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.GetContainerId()})
		fmt.Fprintf(os.Stderr, "kubelet runtime: container %s: %v\n", resp.GetContainerId(), err)
		return nil, err
	}
	var own []string
	for _, kv := range req.GetConfig().GetEnvs() {
		own = append(own, kv.GetKey()+"="+string(kv.GetValue()))
	}
	var env []string
	if edits.ContainerEdits != nil {
		env = edits.Env
	}
	meta := req.GetSandboxConfig().GetMetadata()
	line, err := json.Marshal(created{
		ID: resp.GetContainerId(), Pod: meta.GetName(), Namespace: meta.GetNamespace(),
		Container: req.GetConfig().GetMetadata().GetName(), CDIDevices: names, Env: env, ContainerEnv: own,
		Hooks: hooks,
	})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	_, err = f.Write(append(line, '\n'))
	return resp, err
}

// resolve finds every device in the spec directory, as the runtime's CDI cache does on each
// container's creation, and returns their edits (each spec's once, then each device's, as the
// CDI library's InjectDevices merges them), device nodes left out.
func (r *cdiRuntime) resolve(names []string) (*cdi.ContainerEdits, error) {
	edits := &cdi.ContainerEdits{}
	if len(names) == 0 {
		return edits, nil
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(r.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache over %s: %w", r.cdiDir, err)
	}
	if err := cache.Refresh(); err != nil {
		// Invalid specs are reported and skipped: their devices stay unresolvable.
		fmt.Fprintf(os.Stderr, "kubelet runtime: refreshing CDI specs: %v\n", err)
	}
	var unresolved []string
	seen := map[*cdi.Spec]bool{}
	for _, n := range names {
		d := cache.GetDevice(n)
		if d == nil {
			unresolved = append(unresolved, n)
			continue
		}
		if !seen[d.GetSpec()] {
			seen[d.GetSpec()] = true
			edits.Append(withoutDeviceNodes(d.GetSpec().ContainerEdits))
		}
		edits.Append(withoutDeviceNodes(d.ContainerEdits))
	}
	if len(unresolved) > 0 {
		return nil, fmt.Errorf("failed to inject CDI devices: unresolvable CDI devices %v", unresolved)
	}
	return edits, nil
}

func runRuntime(args []string) error {
	fs := flag.NewFlagSet("runtime", flag.ContinueOnError)
	socket := fs.String("socket", "", "the unix socket to serve the CRI on")
	cdiDir := fs.String("cdi-dir", "", "the CDI spec directory")
	record := fs.String("record", "", "the file each created container is appended to")
	bundles := fs.String("bundles", "", "the directory of the containers' OCI bundles (default: bundles/ beside --record)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *socket == "" || *cdiDir == "" || *record == "" {
		return fmt.Errorf("--socket, --cdi-dir and --record are required")
	}
	if *bundles == "" {
		*bundles = filepath.Join(filepath.Dir(*record), "bundles")
	}
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		return err
	}
	r := &cdiRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), cdiDir: *cdiDir, record: *record, bundles: *bundles}
	// Images have a size once pulled, as a real runtime's do: the kubelet takes an image without
	// one for a failed status and pulls it again for every container, into its pull rate limit.
	r.ImageService.SetFakeImageSize(1 << 20)
	// The tests' image is on the node already, as an image is after its first pull: a hundred
	// pods started at once would otherwise each pull it, into the kubelet's pull rate limit
	// (registryPullQPS), which is not what is measured.
	r.ImageService.SetFakeImages([]string{"pause", "pause:latest"})
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	return server.Serve(l)
}
