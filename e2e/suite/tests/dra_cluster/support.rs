//! The cluster of the DRA scenarios: two DRA pools, three tenants, the real controller, a real
//! agent in DRA mode per node on simulated GPUs, the nodes faked Ready (as Kubernetes' own DRA
//! integration tests do: no kubelet runs), and a fake kubelet per node for the DRA plugin.
//!
//! - `dra-mig-n1` (pool dra-mig): 2 H100s; GPU 0 cut in seven 1g.10gb instances shared by dra-a
//!   (4) and dra-b (3), GPU 1 a whole GPU for dra-a.
//! - `dra-numa-n1` (pool dra-numa): 4 H100s, two on NUMA node 0 and two on 1, all dra-c's.

use gpu_tenancy::api::{GpuNode, GpuTenant};
use gpu_tenancy_e2e::access::{eventually, impersonating, outcome};
use gpu_tenancy_e2e::kubelet::{self, FakeKubelet};
use gpu_tenancy_e2e::procs::{ControllerProcess, SimAgent};
use gpu_tenancy_e2e::{Cleanup, apply_docs_as_kubectl, apply_file, client, ensure_crds, ensure_operator_namespaces};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub const MIG_NODE: &str = "dra-mig-n1";
pub const NUMA_NODE: &str = "dra-numa-n1";
pub const DRIVER: &str = gpu_tenancy::dra::DRIVER;
/// A namespace no tenant lists.
pub const NONE_NS: &str = "dra-none";

pub struct Cluster {
    pub client: Client,
    /// Held for their drop: the cluster's objects deleted, the controller stopped.
    pub _cleanup: Cleanup,
    pub _controller: ControllerProcess,
    pub agents: BTreeMap<&'static str, SimAgent>,
    pub kubelets: BTreeMap<&'static str, FakeKubelet>,
    /// Per namespace, a user with Kubernetes' `edit` role there.
    pub users: BTreeMap<&'static str, Client>,
}

/// The DeviceClass of `tenant`'s devices of `kind` (`mig-1g.10gb`, `gpu`).
pub fn class(tenant: &str, kind: &str) -> String {
    format!("{tenant}.{kind}.gputenancy.io")
}

fn tenant(name: &str, resources: Value) -> Value {
    json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
        "spec": {"tier": "internal", "namespaces": [name], "resources": resources}})
}

fn world() -> Vec<Value> {
    let mig = json!({"mode": "MIG", "profile": "1g.10gb", "count": 0});
    let with = |count: u32| {
        let mut m = mig.clone();
        m["count"] = json!(count);
        m
    };
    vec![
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "dra-mig"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "dra-mig"}}, "deviceAccess": "DRA", "gpus": [
                {"devices": "0", "mode": "MIG", "mig": {"profiles": ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"]}},
                {"devices": "1", "mode": "Exclusive", "tenants": ["dra-a", "dra-b"]}]}}),
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "dra-numa"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "dra-numa"}}, "deviceAccess": "DRA", "gpus": [
                {"devices": "all", "mode": "Exclusive", "tenants": ["dra-c"]}]}}),
        tenant("dra-a", json!([with(4), {"mode": "Exclusive", "count": 1}])),
        tenant("dra-b", json!([with(3)])),
        tenant("dra-c", json!([{"mode": "Exclusive", "count": 4}])),
    ]
}

/// Marks `node` Ready with room for pods, as the DRA integration tests fake their nodes, and
/// lifts the not-ready taint the API server puts on a new Node (the node lifecycle controller
/// would, once it is Ready; it does not run here).
pub async fn fake_ready(client: &Client, node: &str) {
    let now = jiff::Timestamp::now().to_string();
    let room = json!({"cpu": "64", "memory": "512Gi", "pods": "250"});
    let status = json!({"status": {"capacity": room, "allocatable": room, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the e2e suite plays the kubelet",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap_or_else(|e| panic!("faking node {node} Ready: {e}"));
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap_or_else(|e| panic!("lifting node {node}'s not-ready taint: {e}"));
}

/// Waits until `check` returns `Ok`, up to `secs`; panics with its last `Err`.
pub async fn until<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what} within {secs} s: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Every device of the DRA pools: `(node, device)` → its attributes (the ResourceSlices').
pub async fn devices(client: &Client) -> BTreeMap<(String, String), Value> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER}")))
        .await
        .unwrap()
        .items;
    let mut out = BTreeMap::new();
    for s in slices {
        let node = s.spec.node_name.clone().unwrap_or_default();
        for d in s.spec.devices.clone().unwrap_or_default() {
            out.insert((node.clone(), d.name.clone()), serde_json::to_value(&d).unwrap());
        }
    }
    out
}

pub fn attr<'a>(device: &'a Value, name: &str) -> &'a Value {
    let a = &device["attributes"][name];
    if a["string"].is_null() { &a["int"] } else { &a["string"] }
}

/// The devices the scheduler allocated `claim` (in `ns`): `(pool, device)`.
pub async fn allocation(client: &Client, ns: &str, claim: &str) -> Option<Vec<(String, String)>> {
    let c = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .get_opt(claim)
        .await
        .ok()??;
    let results = c.status?.allocation?.devices?.results?;
    Some(results.into_iter().map(|r| (r.pool, r.device)).collect())
}

/// A claim of `count` devices of `class`, with `extra` merged into its one request's `exactly`.
pub fn claim_body(name: &str, class: &str, count: u32, extra: Value) -> Value {
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if let (Value::Object(e), Value::Object(x)) = (&mut exactly, extra) {
        e.extend(x);
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
}

/// A pod with one container; `claims` its `spec.resourceClaims` (each used by the container),
/// `limits` its container's limits.
pub fn pod_body(name: &str, claims: Value, limits: Value) -> Value {
    let uses: Vec<Value> = claims
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"name": c["name"]}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "resourceClaims": claims,
        "containers": [{"name": "c", "image": "pause", "resources": {"claims": uses, "limits": limits},
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}}]}})
}

/// Creates `body` (a claim, template or pod) in `ns` as `user`; the API server's refusal, if any.
/// A write that lost a race on its namespace's ResourceQuota (409 `Conflict`: quota admission
/// updates the quota's usage, which the quota controller may have just recounted) is made again,
/// as every client of the API server does; a refusal is not.
pub async fn create(user: &Client, ns: &str, body: &Value) -> Result<(), String> {
    let mut tries = 0;
    loop {
        let r = create_once(user, ns, body).await;
        tries += 1;
        match &r {
            Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "Conflict" && tries < 5 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => return outcome(r),
        }
    }
}

async fn create_once(user: &Client, ns: &str, body: &Value) -> Result<(), kube::Error> {
    let kind = body["kind"].as_str().unwrap();
    match kind {
        "ResourceClaim" => Api::<ResourceClaim>::namespaced(user.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(body.clone()).unwrap())
            .await
            .map(|_| ()),
        "Pod" => Api::<Pod>::namespaced(user.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(body.clone()).unwrap())
            .await
            .map(|_| ()),
        other => {
            let ar =
                kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("resource.k8s.io", "v1", other));
            Api::<kube::core::DynamicObject>::namespaced_with(user.clone(), ns, &ar)
                .create(&PostParams::default(), &serde_json::from_value(body.clone()).unwrap())
                .await
                .map(|_| ())
        }
    }
}

pub async fn delete_claim(client: &Client, ns: &str, name: &str) {
    let _ = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await;
}

pub async fn delete_pod(client: &Client, ns: &str, name: &str) {
    let _ = Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
}

/// The edit role in `ns` for user `dev@<ns>`; a client acting as that user.
async fn developer(ns: &str) -> Client {
    let user = format!("dev@{ns}");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "developers", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    apply_docs_as_kubectl(&[binding], "the developers' RoleBinding").await;
    impersonating(&user, &["system:authenticated"], None).await
}

fn isolated(t: &GpuTenant) -> Option<(String, String)> {
    let c = t
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Isolated")?
        .clone();
    Some((c.status, c.reason))
}

/// The cluster, converged: every tenant `Isolated=True (DraBound)`, its classes and quota in
/// place, every device published untainted, each namespace's rules in force.
pub async fn setup() -> Cluster {
    let client = client().await;
    let cleanup = Cleanup::new();
    ensure_crds(&client).await;
    ensure_operator_namespaces(&client).await;
    apply_file("examples/policy.yaml").await;
    let docs = world();
    cleanup.add_docs(&docs);
    apply_docs_as_kubectl(&docs, "the DRA world").await;
    let mig = SimAgent::start_dra(&client, &cleanup, MIG_NODE, "dra-mig", 2).await;
    let numa_config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 2, numaNode: 0}\n- {pciDeviceId: \"0x233010DE\", count: 2, numaNode: 1}\n";
    let numa = SimAgent::start_dra_config(&client, &cleanup, NUMA_NODE, "dra-numa", numa_config, 4).await;
    for node in [MIG_NODE, NUMA_NODE] {
        fake_ready(&client, node).await;
    }
    let controller = ControllerProcess::start("dra-cluster", 5);
    let t0 = Instant::now();
    converged(&client).await;
    eprintln!("MEASURE the DRA pools converged in {:.1} s", t0.elapsed().as_secs_f64());

    let mut kubelets = BTreeMap::new();
    for (node, agent) in [(MIG_NODE, &mig), (NUMA_NODE, &numa)] {
        let dir = agent.dir();
        kubelet::register(&dir.join(format!("plugins_registry/{DRIVER}-reg.sock"))).await;
        kubelets.insert(
            node,
            FakeKubelet::new(&client, node, &dir.join(format!("plugins/{DRIVER}/dra.sock"))),
        );
    }
    gpu_tenancy_e2e::create_namespace(&client, &cleanup, NONE_NS, &[]).await;
    let mut users = BTreeMap::new();
    for ns in ["dra-a", "dra-b", "dra-c", NONE_NS] {
        cleanup.add_resource("namespaces", ns);
        let u = developer(ns).await;
        // The RoleBinding and the rules reach the API server's caches a moment after they are written.
        let mut probe = claim_body("probe", "gpu.nvidia.com", 1, json!({}));
        // A new name each try: a probe admitted before the rules arrived does not block the next.
        probe["metadata"] = json!({"generateName": "probe-"});
        eventually(
            &format!("the claims rules reach namespace {ns}"),
            || {
                let (u, p) = (u.clone(), probe.clone());
                async move { create(&u, ns, &p).await }
            },
            // A tenant's namespace must be under its tenant's rules, not the no-tenant ones
            // (which refuse the class too, until the tenant's binding reaches the cache).
            |r| {
                r.as_ref().is_err_and(|e| {
                    e.contains("may not name device class gpu.nvidia.com")
                        && e.contains("belongs to no GpuTenant") == (ns == NONE_NS)
                })
            },
        )
        .await
        .unwrap_err();
        // And no longer under the no-tenant rules: a namespace moving to its tenant's rules is
        // under both for a moment (fail closed), which refuses its own classes too. A claim of
        // its own class, dry-run, is admitted once only its tenant's rules apply.
        if ns != NONE_NS {
            let kind = if ns == "dra-c" { "gpu" } else { "mig-1g.10gb" };
            let own = claim_body("probe-own", &class(ns, kind), 1, json!({}));
            eventually(
                &format!("namespace {ns} under its tenant's claims rules only"),
                || {
                    let (u, p) = (u.clone(), own.clone());
                    async move {
                        Api::<ResourceClaim>::namespaced(u, ns)
                            .create(
                                &PostParams {
                                    dry_run: true,
                                    ..Default::default()
                                },
                                &serde_json::from_value(p).unwrap(),
                            )
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }
                },
                |r| r.is_ok(),
            )
            .await
            .unwrap();
        }
        users.insert(ns, u);
    }
    Cluster {
        client,
        _cleanup: cleanup,
        _controller: controller,
        agents: BTreeMap::from([(MIG_NODE, mig), (NUMA_NODE, numa)]),
        kubelets,
        users,
    }
}

async fn converged(client: &Client) {
    let c = client.clone();
    until("every tenant Isolated=True (DraBound)", 120, || {
        let c = c.clone();
        async move {
            let tenants = Api::<GpuTenant>::all(c)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items;
            let got: Vec<(String, Option<(String, String)>)> =
                tenants.iter().map(|t| (t.name_any(), isolated(t))).collect();
            let want = Some(("True".to_string(), "DraBound".to_string()));
            if got.len() == 3 && got.iter().all(|(_, i)| *i == want) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        }
    })
    .await;
    let c = client.clone();
    until("the DeviceClasses and quotas", 60, || {
        let c = c.clone();
        async move {
            let classes: Vec<String> = Api::<DeviceClass>::all(c.clone())
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(|x| x.name_any())
                .collect();
            for want in [
                class("dra-a", "mig-1g.10gb"),
                class("dra-a", "gpu"),
                class("dra-b", "mig-1g.10gb"),
                class("dra-c", "gpu"),
            ] {
                if !classes.contains(&want) {
                    return Err(format!("no class {want} in {classes:?}"));
                }
            }
            for ns in ["dra-a", "dra-b", "dra-c"] {
                let q = Api::<ResourceQuota>::namespaced(c.clone(), ns)
                    .get_opt("gpu-tenancy")
                    .await
                    .unwrap();
                // Quota admission refuses against the status the quota controller computed.
                if q.and_then(|q| q.status).and_then(|s| s.hard).is_none() {
                    return Err(format!("the quota of {ns} has no status yet"));
                }
            }
            let ns = Api::<Namespace>::all(c).list(&ListParams::default()).await.unwrap();
            if ns.items.iter().filter(|n| n.name_any().starts_with("dra-")).count() < 3 {
                return Err("the tenant namespaces are not there".into());
            }
            Ok(())
        }
    })
    .await;
    let c = client.clone();
    until("every device published, untainted", 120, || {
        let c = c.clone();
        async move {
            let d = devices(&c).await;
            let on = |n: &str| d.iter().filter(|((node, _), _)| node == n).count();
            let tainted: Vec<&(String, String)> = d
                .iter()
                .filter(|(_, v)| v.get("taints").is_some())
                .map(|(k, _)| k)
                .collect();
            if on(MIG_NODE) == 8 && on(NUMA_NODE) == 4 && tainted.is_empty() {
                Ok(())
            } else {
                let nodes = Api::<GpuNode>::all(c).list(&ListParams::default()).await.unwrap().items;
                let st: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("{}: {:?}", n.name_any(), n.status.as_ref().map(|s| &s.conditions)))
                    .collect();
                Err(format!(
                    "{} + {} devices, tainted {tainted:?}; {st:?}",
                    on(MIG_NODE),
                    on(NUMA_NODE)
                ))
            }
        }
    })
    .await;
}

/// A tiny xorshift generator: the scenarios' random order and sizes, reproducible from the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The API server's audit log (e2e/controlplane writes it next to the kubeconfig).
pub fn audit_log() -> Vec<Value> {
    let path = gpu_tenancy_e2e::kubeconfig_path().with_file_name("audit.log");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn tenants(client: &Client) -> Api<GpuTenant> {
    Api::all(client.clone())
}

/// Creates ResourceClaimTemplate `body` in `ns` (admin), retrying while the tenant's admission
/// rules reach the API server's cache after its namespace exists; one already there is kept.
pub async fn create_template(client: &Client, ns: &str, body: &Value) {
    let api = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaimTemplate"),
            "resourceclaimtemplates",
        ),
    );
    until("the claim template admitted under the tenant's rules", 60, || {
        let (api, body) = (api.clone(), body.clone());
        async move {
            match api
                .create(
                    &kube::api::PostParams::default(),
                    &serde_json::from_value(body).unwrap(),
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
}
