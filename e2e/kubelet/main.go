// Command kubelet is Kubernetes' own kubelet, built from k8s.io/kubernetes cmd/kubelet at the
// control plane's version, for the node-side end-to-end tests; with the first argument `runtime`
// it is instead a CRI runtime that runs no containers (runtime.go), with `device-plugin` a device
// plugin advertising what NVIDIA's would for a node's config (deviceplugin.go).
//
//	kubelet --config FILE --kubeconfig FILE --root-dir DIR ...   (the kubelet's own flags)
//	kubelet runtime --socket PATH --cdi-dir DIR --record FILE [--bundles DIR]
//	kubelet device-plugin --plugin-dir DIR --config FILE --gpus GPU-...,...
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "runtime" {
		if err := runRuntime(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet runtime: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "device-plugin" {
		if err := runDevicePlugin(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet device-plugin: %v\n", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
