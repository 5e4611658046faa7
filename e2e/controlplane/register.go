package main

// `controlplane register-plugin --socket PATH`: registers the kubelet plugin serving PATH the way
// the kubelet itself does, with the kubelet's own code (k8s.io/kubernetes
// pkg/kubelet/pluginmanager/operationexecutor at the control plane's version): it dials the socket
// by its bare path (so grpc-go sends the percent-encoded path as the HTTP/2 :authority), calls
// GetInfo, validates and records the plugin, and calls NotifyRegistrationStatus. It prints
// `registered NAME ENDPOINT VERSIONS` and exits 0, or prints the kubelet's error and exits 1.

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/operationexecutor"
)

// recordingHandler accepts every plugin of its type and remembers what it was told.
type recordingHandler struct {
	name, endpoint string
	versions       []string
}

func (h *recordingHandler) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	if name == "" || endpoint == "" || len(versions) == 0 {
		return fmt.Errorf("plugin info incomplete: name %q endpoint %q versions %v", name, endpoint, versions)
	}
	return nil
}

func (h *recordingHandler) RegisterPlugin(_ context.Context, name, endpoint string, versions []string, _ *time.Duration) error {
	h.name, h.endpoint, h.versions = name, endpoint, versions
	return nil
}

func (h *recordingHandler) DeRegisterPlugin(context.Context, string, string) {}

func cmdRegisterPlugin(args []string) error {
	fs := flag.NewFlagSet("register-plugin", flag.ContinueOnError)
	socket := fs.String("socket", "", "the plugin's registration socket")
	pluginType := fs.String("type", "DRAPlugin", "the plugin type the kubelet has a handler for")
	timeout := fs.Duration("timeout", 20*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *socket == "" {
		return fmt.Errorf("--socket is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	h := &recordingHandler{}
	register := operationexecutor.NewOperationGenerator(record.NewFakeRecorder(16)).GenerateRegisterPluginFunc(
		ctx, *socket, types.UID("e2e"), map[string]cache.PluginHandler{*pluginType: h}, cache.NewActualStateOfWorld())
	if err := register(); err != nil {
		return err
	}
	if h.name == "" {
		return fmt.Errorf("the kubelet's registration returned without registering the plugin")
	}
	fmt.Printf("registered %s %s %s\n", h.name, h.endpoint, strings.Join(h.versions, ","))
	return nil
}
