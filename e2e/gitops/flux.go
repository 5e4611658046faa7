package main

// Apply and wait as Flux's kustomize-controller does: its ResourceManager (fluxcd/pkg/ssa)
// applies the manifests with server-side apply under the field manager kustomize-controller
// (ApplyAllStaged: CRDs, namespaces and class definitions first), and its health check waits for
// the applied set with WaitForSetWithContext, whose kstatus poller reads every object until all
// are Current. The wait stops early once every object is Current or Failed (Failed never turns
// Current on its own); with --fail-fast (kustomize-controller's FailFast) as soon as one is Failed.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/pkg/ssa"
	"github.com/fluxcd/pkg/ssa/normalize"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	fluxFieldManager = "kustomize-controller"
	fluxOwnerGroup   = "kustomize.toolkit.fluxcd.io"
)

type fluxArgs struct {
	kubeconfig string
	timeout    time.Duration
	interval   time.Duration
	failFast   bool
	files      []string
}

func parseFluxArgs(args []string) (fluxArgs, error) {
	a := fluxArgs{timeout: 60 * time.Second, interval: 5 * time.Second}
	value := func(i *int, name string) (string, error) {
		arg := args[*i]
		if v, ok := strings.CutPrefix(arg, name+"="); ok {
			return v, nil
		}
		if *i+1 >= len(args) {
			return "", fmt.Errorf("%s needs a value", name)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		var err error
		var v string
		switch {
		case arg == "--kubeconfig" || strings.HasPrefix(arg, "--kubeconfig="):
			a.kubeconfig, err = value(&i, "--kubeconfig")
		case arg == "--timeout" || strings.HasPrefix(arg, "--timeout="):
			if v, err = value(&i, "--timeout"); err == nil {
				a.timeout, err = time.ParseDuration(v)
			}
		case arg == "--interval" || strings.HasPrefix(arg, "--interval="):
			if v, err = value(&i, "--interval"); err == nil {
				a.interval, err = time.ParseDuration(v)
			}
		case arg == "--fail-fast":
			a.failFast = true
		case strings.HasPrefix(arg, "--"):
			err = fmt.Errorf("unknown flag %s", arg)
		default:
			a.files = append(a.files, arg)
		}
		if err != nil {
			return a, err
		}
	}
	if a.kubeconfig == "" {
		a.kubeconfig = os.Getenv("KUBECONFIG")
	}
	switch {
	case a.kubeconfig == "":
		return a, fmt.Errorf("--kubeconfig is required")
	case len(a.files) == 0:
		return a, fmt.Errorf("no manifest files")
	case a.timeout <= 0 || a.interval <= 0:
		return a, fmt.Errorf("--timeout and --interval must be positive")
	}
	return a, nil
}

func cmdFluxApplyWait(args []string, stdout, stderr io.Writer) int {
	a, err := parseFluxArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "gitops flux-apply-wait: %v\n%s", err, usage)
		return exitUsage
	}
	var objects []*unstructured.Unstructured
	for _, f := range a.files {
		objs, err := readObjects(f, os.Stdin)
		if err != nil {
			fmt.Fprintf(stderr, "gitops: %v\n", err)
			return exitUsage
		}
		objects = append(objects, objs...)
	}
	if len(objects) == 0 {
		fmt.Fprintf(stderr, "gitops: no Kubernetes objects in %s\n", strings.Join(a.files, ", "))
		return exitUsage
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", a.kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "gitops: loading %s: %v\n", a.kubeconfig, err)
		return exitUsage
	}
	kube, err := client.New(cfg, client.Options{})
	if err != nil {
		fmt.Fprintf(stderr, "gitops: connecting to the cluster: %v\n", err)
		return exitUsage
	}
	poller := polling.NewStatusPoller(kube, kube.RESTMapper(), polling.Options{})
	manager := ssa.NewResourceManager(kube, poller, ssa.Owner{Field: fluxFieldManager, Group: fluxOwnerGroup})

	ctx := context.Background()
	if err := normalize.UnstructuredList(objects); err != nil {
		fmt.Fprintf(stderr, "gitops: normalizing the objects: %v\n", err)
		return exitUsage
	}
	applyOpts := ssa.DefaultApplyOptions()
	changeSet, err := manager.ApplyAllStaged(ctx, objects, applyOpts)
	if changeSet != nil {
		for _, e := range changeSet.Entries {
			fmt.Fprintf(stderr, "gitops: %s\n", e.String())
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "gitops: apply failed: %v\n", err)
		return exitUsage
	}

	waitErr := manager.WaitForSetWithContext(ctx, changeSet.ToObjMetadataSet(), ssa.WaitOptions{
		Interval: a.interval,
		Timeout:  a.timeout,
		FailFast: a.failFast,
	})
	if waitErr != nil {
		fmt.Fprintf(stderr, "gitops: %v\n", waitErr)
	}

	// The status of each object as it is now, by kstatus (what the poller computed).
	enc := json.NewEncoder(stdout)
	failed, notCurrent := 0, 0
	for _, o := range objects {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		s := objectStatus{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName(), Namespace: o.GetNamespace()}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
			s.Status, s.Message = "Unknown", err.Error()
		} else {
			s = compute(live)
		}
		s.Source = "cluster"
		switch s.Status {
		case "Current":
		case "Failed":
			failed++
		default:
			notCurrent++
		}
		if err := enc.Encode(s); err != nil {
			fmt.Fprintf(stderr, "gitops: %v\n", err)
			return exitUsage
		}
	}
	switch {
	case failed > 0:
		return 1
	case waitErr != nil || notCurrent > 0:
		return 2
	}
	return 0
}
