package main

// kube-scheduler, run in-process behind `up --scheduler` (off by default, so the suites that
// rely on pods staying unscheduled, or that bind pods themselves, see no difference). With it,
// and the ResourceClaim controller that startControllers then adds, the control plane does
// what a cluster does for Dynamic Resource Allocation short of a kubelet: a pod's
// ResourceClaimTemplates become claims, the scheduler allocates devices from ResourceSlices to
// them (claim status.allocation and status.reservedFor, written by the scheduler as on a real
// cluster), and binds the pod to a node through the Binding subresource. Pods that ask for an
// extended resource that a DeviceClass's spec.extendedResourceName maps to DRA get a claim the
// scheduler creates itself.
//
// Wired the way Kubernetes' own DRA integration tests start it (test/integration/dra/dra.go
// startScheduler, test/integration/util/util.go StartSchedulerWithDone), with the two things
// kube-scheduler adds (cmd/kube-scheduler/app/options/options.go Config, app/server.go Setup and
// Run): a dynamic informer factory, which the scheduler needs for the events of resources that
// are no built-in types, and the component-config version. The configuration is kube-scheduler's
// with no --config: an empty KubeSchedulerConfiguration of kubescheduler.config.k8s.io/v1 run
// through the scheme's defaulting, i.e. the single "default-scheduler" profile with every
// default plugin (DynamicResources among them), the default parallelism and backoffs. No
// leader election (one scheduler) and no serving of metrics or healthz.
//
// Feature gates are the process's own (utilfeature.DefaultFeatureGate): the scheduler reads
// the same gates the in-process kube-apiserver was given, so `up ... -- --feature-gates=...`
// reaches both. At 1.37 defaults DRA (DynamicResourceAllocation), extended resources through
// DRA (DRAExtendedResource, GA and locked) and device taints (DRADeviceTaints, DRADeviceTaintRules)
// are on; startScheduler logs the DRA gates it runs with.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/profile"
)

// schedulerFeatures are the gates logged at start (what the DynamicResources plugin and the
// ResourceClaim controller read).
var schedulerFeatures = []featuregate.Feature{
	features.DynamicResourceAllocation,
	features.DRAExtendedResource,
	features.DRADeviceTaints,
	features.DRADeviceTaintRules,
	features.DRAAdminAccess,
	features.DRAPrioritizedList,
	features.DRAConsumableCapacity,
	features.DRAPartitionableDevices,
	features.DRADeviceBindingConditions,
	features.DRAResourceClaimDeviceStatus,
	features.GenericWorkload,
	features.SchedulerAsyncAPICalls,
}

// defaultSchedulerConfig is kube-scheduler's configuration when it is given none: the v1
// defaults converted to the internal type (as test/integration/dra/dra.go
// newSchedulerComponentConfig decodes an empty document).
func defaultSchedulerConfig() (*schedulerconfig.KubeSchedulerConfiguration, error) {
	gvk := kubeschedulerconfigv1.SchemeGroupVersion.WithKind("KubeSchedulerConfiguration")
	cfg := &schedulerconfig.KubeSchedulerConfiguration{}
	if _, _, err := schedulerscheme.Codecs.UniversalDecoder().Decode(nil, &gvk, cfg); err != nil {
		return nil, fmt.Errorf("defaulting the scheduler configuration: %w", err)
	}
	return cfg, nil
}

// startScheduler starts kube-scheduler against the API server of config (its own user agent
// and rate limits) and returns once its informers and event handlers have synced (or waitCtx
// ends: an error), so that a pod created after `up` is ready is scheduled against a complete
// view of nodes, slices and claims. It schedules until ctx is cancelled.
func startScheduler(ctx, waitCtx context.Context, config *rest.Config) error {
	logger := klog.Background().WithName("scheduler")
	ctx = klog.NewContext(ctx, logger)

	cfg, err := defaultSchedulerConfig()
	if err != nil {
		return err
	}
	client, err := clientset.NewForConfig(config)
	if err != nil {
		return err
	}
	dynClient, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	informerFactory := scheduler.NewInformerFactory(client, 0, nil)
	dynInformerFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dynClient, 0, corev1.NamespaceAll, nil)

	// Scheduling events (FailedScheduling, Scheduled) go to events.k8s.io/v1, as kube-scheduler's.
	eventBroadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	eventBroadcaster.StartRecordingToSink(ctx.Done())
	context.AfterFunc(ctx, eventBroadcaster.Shutdown)

	var plugins []string
	sched, err := scheduler.New(
		ctx,
		client,
		informerFactory,
		dynInformerFactory,
		profile.NewRecorderFactory(eventBroadcaster),
		scheduler.WithComponentConfigVersion(kubeschedulerconfigv1.SchemeGroupVersion.String()),
		scheduler.WithKubeConfig(config),
		scheduler.WithProfiles(cfg.Profiles...),
		scheduler.WithPercentageOfNodesToScore(cfg.PercentageOfNodesToScore),
		scheduler.WithPodInitialBackoffSeconds(cfg.PodInitialBackoffSeconds),
		scheduler.WithPodMaxBackoffSeconds(cfg.PodMaxBackoffSeconds),
		scheduler.WithExtenders(cfg.Extenders...),
		scheduler.WithParallelism(cfg.Parallelism),
		scheduler.WithBuildFrameworkCapturer(func(p schedulerconfig.KubeSchedulerProfile) {
			// The profile as completed with the default plugins (all of them multi-point
			// ones): logged below.
			if p.Plugins != nil {
				for _, pl := range p.Plugins.MultiPoint.Enabled {
					plugins = append(plugins, pl.Name)
				}
			}
		}),
	)
	if err != nil {
		return fmt.Errorf("creating the scheduler: %w", err)
	}

	informerFactory.Start(ctx.Done())
	dynInformerFactory.Start(ctx.Done())
	syncCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(waitCtx, cancel)
	defer stop()
	for typ, ok := range informerFactory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("scheduler informer for %v did not sync", typ)
		}
	}
	for gvr, ok := range dynInformerFactory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("scheduler informer for %v did not sync", gvr)
		}
	}
	if err := sched.WaitForHandlersSync(syncCtx); err != nil {
		return fmt.Errorf("scheduler event handlers did not sync: %w", err)
	}
	go sched.Run(ctx)

	gates := make([]string, 0, len(schedulerFeatures))
	for _, f := range schedulerFeatures {
		gates = append(gates, fmt.Sprintf("%s=%t", f, utilfeature.DefaultFeatureGate.Enabled(f)))
	}
	logger.Info("started", "profile", cfg.Profiles[0].SchedulerName, "plugins", plugins, "featureGates", gates)
	return nil
}
