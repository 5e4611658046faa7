package main

// The part of kube-controller-manager that the operator and the tests rely on, run in-process
// the way Kubernetes' own integration tests do it (test/integration/garbagecollector and
// test/integration/namespace) and wired like kube-controller-manager does
// (cmd/kube-controller-manager/app/core.go):
//
//   - garbage collector: deletes objects whose ownerReferences all point to deleted owners,
//     custom resources included (owners and dependents of CRD kinds); CRDs installed later are
//     picked up by a periodic discovery sync (garbagecollector.Sync);
//   - namespace controller: deleting a namespace deletes its content, then the namespace;
//   - serviceaccount controller: every namespace gets its `default` ServiceAccount;
//   - clusterrole aggregation controller: fills the aggregated ClusterRoles (admin, edit, view)
//     from the roles labelled to aggregate into them, so a user bound to `edit` can do what
//     `edit` grants on a real cluster (the tenancy attack tests act as such users);
//   - resource quota controller: computes each ResourceQuota's status (hard and used). The API
//     server's ResourceQuota admission plugin refuses a pod beyond a quota only against that
//     status, so without this controller no quota refuses anything (test/integration/quota runs
//     it the same way).
//
// With `up --scheduler` (scheduler.go), also:
//
//   - resourceclaim controller (cmd/kube-controller-manager/app/resource.go
//     newResourceClaimController; test/integration/dra/dra.go runs it the same way next to the
//     scheduler): creates a pod's ResourceClaims from its ResourceClaimTemplates and records
//     their names in the pod's status.resourceClaimStatuses (the scheduler waits for that before
//     it allocates), drops finished or deleted pods from a claim's status.reservedFor and
//     deletes the claims it generated for them. Its feature options (admin access, prioritized
//     list, generic workload / pod-group claims) are not arguments: resourceclaim.NewController
//     reads them from the process's feature gates, so they are the 1.37 defaults (admin access
//     and prioritized list on, the beta GenericWorkload and DRAWorkloadResourceClaims off: no
//     PodGroup informer) unless `-- --feature-gates=...` changes them.
//
// Nothing else of kube-controller-manager runs (no token or root CA publishing, no workload
// controllers, no node lifecycle or device taint eviction controller).

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/quota/v1/generic"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	pkgcontroller "k8s.io/kubernetes/pkg/controller"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
	resourceclaimcontroller "k8s.io/kubernetes/pkg/controller/resourceclaim"
	resourcequotacontroller "k8s.io/kubernetes/pkg/controller/resourcequota"
	serviceaccountcontroller "k8s.io/kubernetes/pkg/controller/serviceaccount"
	quotainstall "k8s.io/kubernetes/pkg/quota/v1/install"
)

const (
	// How often the garbage collector re-reads discovery (new CRDs get monitors) and the
	// RESTMapper is reset. kube-controller-manager uses 30s; the integration tests 5s. A local
	// discovery read is two requests, so a short period costs little and lets a freshly
	// installed CRD's objects be collected within seconds.
	gcSyncPeriod = 2 * time.Second
	gcWorkers    = 5
	// kube-controller-manager's default --namespace-sync-period; deletions are event-driven.
	namespaceSyncPeriod = 5 * time.Minute
	namespaceWorkers    = 2
	// Quota status is recomputed on every change of a quota or of the objects it counts; the full
	// resync is kube-controller-manager's --resource-quota-sync-period default. Discovery is read
	// again as often as the garbage collector's, so quotas on CRD-backed counts work soon after.
	quotaResyncPeriod = 5 * time.Minute
	quotaWorkers      = 5
	// kube-controller-manager's default is 50 (sized for 1000 simulated nodes); a handful of
	// pods needs far fewer, and the integration tests run one.
	resourceClaimWorkers = 10
)

// startControllers starts the controllers against the API server of kubeconfig (the admin
// credentials the tests use) and returns once their shared informers have synced (or waitCtx
// ends: an error). They run until ctx is cancelled. withScheduler adds the ResourceClaim
// controller and kube-scheduler (startScheduler), and then also waits for the scheduler's
// informers and event handlers.
func startControllers(ctx, waitCtx context.Context, kubeconfig string, withScheduler bool) error {
	base, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	// One local API server, few objects: no client-side throttling (the namespace controller
	// alone makes a discovery call and a delete call per resource type).
	base.QPS = 1000
	base.Burst = 2000
	config := func(userAgent string) *rest.Config {
		return rest.AddUserAgent(rest.CopyConfig(base), userAgent)
	}
	logger := klog.Background().WithName("controllers")
	ctx = klog.NewContext(ctx, logger)

	sharedClient, err := clientset.NewForConfig(config("shared-informers"))
	if err != nil {
		return err
	}
	sharedMetadataClient, err := metadata.NewForConfig(config("shared-informers"))
	if err != nil {
		return err
	}
	sharedInformers := informers.NewSharedInformerFactory(sharedClient, 0)
	metadataInformers := metadatainformer.NewSharedInformerFactory(sharedMetadataClient, 0)
	// Closed once every controller is built and the shared informers are started (as in
	// kube-controller-manager), so the garbage collector's monitors join the same factories.
	informersStarted := make(chan struct{})

	// Garbage collector.
	gcConfig := config("generic-garbage-collector")
	gcClient, err := clientset.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	gcMetadataClient, err := metadata.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	// The RESTMapper's discovery client must not be the one garbagecollector.Sync reads (Sync
	// resets the mapper when discovery changes).
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(gcClient.Discovery()))
	restMapper.Reset()
	syncDiscovery, err := clientset.NewForConfig(gcConfig)
	if err != nil {
		return err
	}
	gc, err := garbagecollector.NewGarbageCollector(
		ctx,
		gcClient,
		gcMetadataClient,
		restMapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(sharedInformers, metadataInformers),
		informersStarted,
	)
	if err != nil {
		return fmt.Errorf("creating the garbage collector: %w", err)
	}

	// Namespace controller.
	nsConfig := config("namespace-controller")
	nsClient, err := clientset.NewForConfig(nsConfig)
	if err != nil {
		return err
	}
	nsMetadataClient, err := metadata.NewForConfig(nsConfig)
	if err != nil {
		return err
	}
	namespaces := namespacecontroller.NewNamespaceController(
		ctx,
		nsClient,
		nsMetadataClient,
		nsClient.Discovery().ServerPreferredNamespacedResources,
		sharedInformers.Core().V1().Namespaces(),
		namespaceSyncPeriod,
		v1.FinalizerKubernetes,
	)

	// ServiceAccount controller.
	saClient, err := clientset.NewForConfig(config("service-account-controller"))
	if err != nil {
		return err
	}
	serviceAccounts, err := serviceaccountcontroller.NewServiceAccountsController(
		logger,
		sharedInformers.Core().V1().ServiceAccounts(),
		sharedInformers.Core().V1().Namespaces(),
		saClient,
		serviceaccountcontroller.DefaultServiceAccountsControllerOptions(),
	)
	if err != nil {
		return fmt.Errorf("creating the serviceaccount controller: %w", err)
	}

	// Resource quota controller (cmd/kube-controller-manager/app/core.go newResourceQuotaController).
	quotaClient, err := clientset.NewForConfig(config("resourcequota-controller"))
	if err != nil {
		return err
	}
	quotaDiscovery := quotaClient.Discovery().ServerPreferredNamespacedResources
	objectOrMetadataInformers := informerfactory.NewInformerFactory(sharedInformers, metadataInformers)
	quotaConfiguration, err := quotainstall.NewQuotaConfigurationForControllers(
		generic.ListerFuncForResourceFunc(sharedInformers.ForResource), sharedInformers)
	if err != nil {
		return fmt.Errorf("configuring quota evaluators: %w", err)
	}
	quotas, err := resourcequotacontroller.NewController(ctx, &resourcequotacontroller.ControllerOptions{
		QuotaClient:               quotaClient.CoreV1(),
		ResourceQuotaInformer:     sharedInformers.Core().V1().ResourceQuotas(),
		ResyncPeriod:              pkgcontroller.StaticResyncPeriodFunc(quotaResyncPeriod),
		InformerFactory:           objectOrMetadataInformers,
		ReplenishmentResyncPeriod: pkgcontroller.StaticResyncPeriodFunc(quotaResyncPeriod),
		DiscoveryFunc:             quotaDiscovery,
		IgnoredResourcesFunc:      quotaConfiguration.IgnoredResources,
		InformersStarted:          informersStarted,
		Registry:                  generic.NewRegistry(quotaConfiguration.Evaluators()),
		UpdateFilter:              quotainstall.DefaultUpdateFilter(),
	})
	if err != nil {
		return fmt.Errorf("creating the resource quota controller: %w", err)
	}

	// ClusterRole aggregation controller (cmd/kube-controller-manager/app/rbac.go).
	aggregationClient, err := clientset.NewForConfig(config("clusterrole-aggregation-controller"))
	if err != nil {
		return err
	}
	aggregation := clusterroleaggregation.NewClusterRoleAggregation(
		sharedInformers.Rbac().V1().ClusterRoles(),
		aggregationClient.RbacV1(),
	)

	started := []string{"garbagecollector", "namespace", "serviceaccount", "resourcequota", "clusterrole-aggregation"}

	// ResourceClaim controller, on the shared informers as in kube-controller-manager (its pod
	// and claim informers are the ones the garbage collector and quota already watch).
	if withScheduler {
		claimClient, err := clientset.NewForConfig(config("resource-claim-controller"))
		if err != nil {
			return err
		}
		claims, err := resourceclaimcontroller.NewController(
			logger.WithName("resourceclaim"),
			claimClient,
			sharedInformers.Core().V1().Pods(),
			sharedInformers.Scheduling().V1beta1().PodGroups(), // only read with GenericWorkload
			sharedInformers.Resource().V1().ResourceClaims(),
			sharedInformers.Resource().V1().ResourceClaimTemplates(),
		)
		if err != nil {
			return fmt.Errorf("creating the resourceclaim controller: %w", err)
		}
		go claims.Run(ctx, resourceClaimWorkers)
		started = append(started, "resourceclaim")

		// The root CA publisher (kube-controller-manager's root-ca-cert-publisher): every
		// namespace's kube-root-ca.crt, which a real kubelet mounts into pods with a service
		// account token.
		publisherClient, err := clientset.NewForConfig(config("root-ca-cert-publisher"))
		if err != nil {
			return err
		}
		publisher, err := rootcacertpublisher.NewPublisher(
			sharedInformers.Core().V1().ConfigMaps(),
			sharedInformers.Core().V1().Namespaces(),
			publisherClient,
			base.CAData,
		)
		if err != nil {
			return fmt.Errorf("creating the root CA publisher: %w", err)
		}
		go publisher.Run(ctx, 1)
		started = append(started, "root-ca-cert-publisher")
	}

	go wait.Until(restMapper.Reset, gcSyncPeriod, ctx.Done())
	go gc.Run(ctx, gcWorkers, gcSyncPeriod)
	go gc.Sync(ctx, syncDiscovery.Discovery(), gcSyncPeriod)
	go namespaces.Run(ctx, namespaceWorkers)
	go serviceAccounts.Run(ctx, 1)
	go quotas.Run(ctx, quotaWorkers)
	go aggregation.Run(ctx, 5)
	go quotas.Sync(ctx, quotaDiscovery, gcSyncPeriod)

	sharedInformers.Start(ctx.Done())
	metadataInformers.Start(ctx.Done())
	close(informersStarted)
	syncCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(waitCtx, cancel)
	defer stop()
	for typ, ok := range sharedInformers.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	logger.Info("started", "controllers", started)
	if withScheduler {
		// Last, on informers of its own as the kube-scheduler process has them: once it is
		// ready, the ResourceClaim controller already runs (a pod with a claim template waits
		// in the scheduler's queue until the controller has created its claim).
		if err := startScheduler(ctx, waitCtx, config("kube-scheduler")); err != nil {
			return fmt.Errorf("starting kube-scheduler: %w", err)
		}
	}
	return nil
}
