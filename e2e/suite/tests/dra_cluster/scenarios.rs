//! The scenarios, in the order the test runs them on one cluster.

use crate::support::*;
use gpu_tenancy_e2e::kubelet::{FakeKubelet, PodRun, Synced};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

const MIG_KIND: &str = "mig-1g.10gb";

/// Syncs `kubelet` until it starts pod `ns/name` (up to `secs`); its run. A refusal fails.
async fn started(kubelet: &mut FakeKubelet, ns: &str, name: &str, secs: u64) -> PodRun {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        // One pod at a time in these scenarios: whatever starts must be this one.
        if let Some(s) = kubelet.sync().await.into_iter().next() {
            match s {
                Synced::Started(run) if run.namespace == ns && run.name == name => return run,
                Synced::Started(run) => panic!("pod {}/{} started unexpectedly", run.namespace, run.name),
                Synced::Refused { pod, claim, error, .. } => {
                    panic!("the DRA plugin refused {pod}'s claim {claim}: {error}")
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "pod {ns}/{name} did not start within {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn refused(what: &str, got: Result<(), String>, says: &[&str]) {
    match got {
        Ok(()) => panic!("{what}: ADMITTED"),
        Err(e) => {
            let missing: Vec<&&str> = says.iter().filter(|s| !e.contains(**s)).collect();
            assert!(missing.is_empty(), "{what}: refused without {missing:?}: {e}");
            eprintln!("refused   {what:<66} {}", e.chars().take(150).collect::<String>());
        }
    }
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The scheduler's allocations in `namespaces`: each allocated device's tenant is its claim's
/// namespace's, no device is allocated twice, and no tenant holds more than its grant. Returns
/// the claims seen allocated and the devices held per namespace.
async fn check_allocations(
    client: &Client,
    devices: &BTreeMap<(String, String), Value>,
    grants: &BTreeMap<&str, u64>,
) -> (BTreeSet<String>, BTreeMap<String, u64>) {
    let mut taken: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut allocated = BTreeSet::new();
    let mut held = BTreeMap::new();
    for ns in grants.keys() {
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        for claim in claims {
            let key = format!("{ns}/{}", claim.name_any());
            let results = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            if results.is_empty() {
                continue;
            }
            allocated.insert(key.clone());
            for r in results {
                let dev = (r.pool.clone(), r.device.clone());
                let tenant = devices.get(&dev).map(|d| attr(d, "tenant").clone()).unwrap_or_default();
                assert_eq!(
                    tenant,
                    json!(ns),
                    "claim {key} was allocated {dev:?}, a device of {tenant}"
                );
                if let Some(other) = taken.insert(dev.clone(), key.clone()) {
                    panic!("{dev:?} is allocated to both {other} and {key}");
                }
                *held.entry(ns.to_string()).or_insert(0) += 1;
            }
        }
        let h = held.get(*ns).copied().unwrap_or(0);
        assert!(
            h <= grants[ns],
            "{ns} holds {h} devices, more than its grant of {}",
            grants[ns]
        );
    }
    (allocated, held)
}

/// Why the pending pods of the tenants' namespaces are pending, as the scheduler says.
async fn pending_reasons(client: &Client) -> String {
    let mut out = Vec::new();
    for ns in ["dra-a", "dra-b", "dra-c"] {
        for p in Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            let st = p.status.clone().unwrap_or_default();
            if st.phase.as_deref() == Some("Pending") {
                let why = st
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled")
                    .and_then(|c| c.message);
                out.push(format!("{ns}/{}: {}", p.name_any(), why.unwrap_or_default()));
            }
        }
    }
    out.join("; ")
}

/// Writes by component in the audit log since `since`: (who, resource, verb) → count.
fn writes_since(since: jiff::Timestamp) -> BTreeMap<(String, String, String), usize> {
    let mut out = BTreeMap::new();
    for e in audit_log() {
        let verb = e["verb"].as_str().unwrap_or("");
        if !["create", "update", "patch", "delete"].contains(&verb) {
            continue;
        }
        let at: Option<jiff::Timestamp> = e["requestReceivedTimestamp"].as_str().and_then(|t| t.parse().ok());
        if at.is_none_or(|t| t < since) {
            continue;
        }
        let obj = &e["objectRef"];
        let resource = match obj["subresource"].as_str() {
            Some(s) => format!("{}/{s}", obj["resource"].as_str().unwrap_or("")),
            None => obj["resource"].as_str().unwrap_or("").to_string(),
        };
        let user = e["impersonatedUser"]["username"].as_str().unwrap_or("");
        let agent = e["userAgent"].as_str().unwrap_or("");
        let who = if user.starts_with("dev@") {
            "tenant users".to_string()
        } else if let Some((_, component)) = agent.rsplit_once("kubernetes/$Format/") {
            // The in-process controllers of e2e/controlplane name themselves after the format.
            component.to_string()
        } else if agent.starts_with("controlplane/") {
            "control plane (unnamed client)".to_string()
        } else if resource.starts_with("pods") {
            // This project's processes and the test share a client library (no user agent of
            // its own): tell them by what they write. The fake kubelet writes pods.
            "the fake kubelet".to_string()
        } else {
            "gpu-tenancy agent+controller".to_string()
        };
        *out.entry((who, resource, verb.to_string())).or_insert(0) += 1;
    }
    out
}

/// 100 pods of dra-a and dra-b in random order, each with a claim of one or two of its tenant's
/// 1g.10gb instances, on the one node whose GPU 0 both share; pods end at random. At every step
/// the scheduler has allocated each claim only its tenant's instances, never one twice, never a
/// tenant more than its grant; the API server refused the claims beyond the quota.
pub async fn random_pods_on_a_shared_mig_node(c: &mut Cluster, n: usize) {
    let grants = BTreeMap::from([("dra-a", 4u64), ("dra-b", 3)]);
    let devices = devices(&c.client).await;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut queue: VecDeque<(String, &str, u32)> = (0..n)
        .map(|i| {
            let ns = if rng.below(2) == 0 { "dra-a" } else { "dra-b" };
            (format!("w{i}"), ns, 1 + rng.below(2) as u32)
        })
        .collect();
    let since = jiff::Timestamp::now();
    let t0 = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let (mut to_allocated, mut to_running, mut prepare_ms) = (vec![], vec![], vec![]);
    let mut seen = BTreeSet::new();
    let (mut quota_refusals, mut finished) = (0usize, 0usize);
    let mut peak: BTreeMap<String, u64> = BTreeMap::new();
    let kubelet = c.kubelets.get_mut(MIG_NODE).unwrap();
    let mut progress = Instant::now();
    while finished < n {
        if progress.elapsed() > Duration::from_secs(60) {
            panic!(
                "{finished} of {n} pods done, none started for 60 s: {}",
                pending_reasons(&c.client).await
            );
        }
        for _ in 0..3 {
            let Some((name, ns, size)) = queue.pop_front() else {
                break;
            };
            let user = &c.users[ns];
            match create(user, ns, &claim_body(&name, &class(ns, MIG_KIND), size, json!({}))).await {
                Ok(()) => {}
                Err(e) if e.contains("exceeded quota") => {
                    quota_refusals += 1;
                    queue.push_back((name, ns, size));
                    break;
                }
                Err(e) => panic!("claim {ns}/{name}: {e}"),
            }
            let pod = pod_body(&name, json!([{"name": "gpu", "resourceClaimName": name}]), json!({}));
            create(user, ns, &pod)
                .await
                .unwrap_or_else(|e| panic!("pod {ns}/{name}: {e}"));
            created.insert(format!("{ns}/{name}"), Instant::now());
        }
        let (allocated, held) = check_allocations(&c.client, &devices, &grants).await;
        for (ns, h) in held {
            let p = peak.entry(ns).or_insert(0);
            *p = (*p).max(h);
        }
        for key in allocated {
            if let Some(t) = created.get(&key).filter(|_| seen.insert(key.clone())) {
                to_allocated.push(t.elapsed());
            }
        }
        for s in kubelet.sync().await {
            match s {
                Synced::Started(run) => {
                    progress = Instant::now();
                    for d in run.devices() {
                        let t = attr(&devices[&(MIG_NODE.to_string(), d.clone())], "tenant").clone();
                        assert_eq!(
                            t,
                            json!(run.namespace),
                            "pod {}/{} was prepared {d} of {t}",
                            run.namespace,
                            run.name
                        );
                    }
                    if let Some(t) = created.get(&format!("{}/{}", run.namespace, run.name)) {
                        to_running.push(t.elapsed());
                    }
                }
                Synced::Refused { pod, error, .. } => panic!("the DRA plugin refused pod {pod}: {error}"),
            }
        }
        let running: Vec<String> = kubelet.running.keys().cloned().collect();
        for uid in running {
            if rng.below(3) == 0 {
                let t = Instant::now();
                let run = kubelet.finish(&uid).await;
                prepare_ms.push(t.elapsed());
                let user = &c.users[run.namespace.as_str()];
                delete_claim(user, &run.namespace, &run.name).await;
                finished += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = t0.elapsed();
    eprintln!(
        "MEASURE {n} pods of 2 tenants on one shared MIG node in {:.1} s: peak devices held {peak:?} (grants {grants:?}), {quota_refusals} claims refused by quota and made again later",
        took.as_secs_f64()
    );
    eprintln!(
        "MEASURE claim created -> allocated by kube-scheduler: median {:.0} ms, p95 {:.0} ms, max {:.0} ms (sampled every ~50 ms); -> prepared and Running: median {:.0} ms, p95 {:.0} ms; unprepare + pod end: median {:.0} ms",
        percentile(&mut to_allocated, 0.5),
        percentile(&mut to_allocated, 0.95),
        percentile(&mut to_allocated, 1.0),
        percentile(&mut to_running, 0.5),
        percentile(&mut to_running, 0.95),
        percentile(&mut prepare_ms, 0.5),
    );
    // The agent's last status write lands within its half-second coalescing window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = writes_since(since);
    let mut by_who: BTreeMap<&str, usize> = BTreeMap::new();
    for ((who, resource, verb), count) in &writes {
        eprintln!("MEASURE   writes {who:<30} {verb:<7} {resource:<26} {count}");
        *by_who.entry(who.as_str()).or_insert(0) += count;
    }
    let system: usize = by_who
        .iter()
        .filter(|(w, _)| !["tenant users", "the fake kubelet"].contains(w))
        .map(|(_, c)| c)
        .sum();
    let ours = by_who.get("gpu-tenancy agent+controller").copied().unwrap_or(0);
    eprintln!(
        "MEASURE API writes per claim over {n} claims: {:.2} by gpu-tenancy (the agent's status.claims, coalesced, and each claim's hand-over evidence), {:.2} by the control plane and gpu-tenancy together ({by_who:?})",
        ours as f64 / n as f64,
        system as f64 / n as f64
    );
}

/// Claims beyond a tenant's grant are refused by the ResourceQuota on its class, one claim or
/// several, and so is a pod asking for the tenant's extended resource once claims hold the grant.
pub async fn claims_beyond_the_quota_are_refused(c: &mut Cluster) {
    let user = &c.users["dra-a"];
    let cls = class("dra-a", MIG_KIND);
    let key = format!("{cls}.deviceclass.resource.k8s.io/devices");
    refused(
        "one claim of 5 instances (dra-a's grant is 4)",
        create(user, "dra-a", &claim_body("q-big", &cls, 5, json!({}))).await,
        &["exceeded quota", &key],
    );
    for i in 0..4 {
        create(user, "dra-a", &claim_body(&format!("q{i}"), &cls, 1, json!({})))
            .await
            .unwrap_or_else(|e| panic!("claim q{i} within the quota: {e}"));
    }
    refused(
        "a fifth claim of one instance",
        create(user, "dra-a", &claim_body("q4", &cls, 1, json!({}))).await,
        &["exceeded quota", &key],
    );
    refused(
        "a pod asking for dra-a.gputenancy.io/mig-1g.10gb while claims hold the grant",
        create(
            user,
            "dra-a",
            &pod_body("q-pod", json!([]), json!({"dra-a.gputenancy.io/mig-1g.10gb": 1})),
        )
        .await,
        &["exceeded quota", "requests.dra-a.gputenancy.io/mig-1g.10gb"],
    );
    for i in 0..4 {
        delete_claim(user, "dra-a", &format!("q{i}")).await;
    }
    let client = c.client.clone();
    until("dra-a's quota free again", 60, || {
        let client = client.clone();
        let key = key.clone();
        async move {
            let q = Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client, "dra-a")
                .get("gpu-tenancy")
                .await
                .unwrap();
            let used = q.status.and_then(|s| s.used).unwrap_or_default();
            match used.get(&key) {
                Some(v) if v.0 != "0" => Err(format!("{key} used {}", v.0)),
                _ => Ok(()),
            }
        }
    })
    .await;
}

/// Claims that name another tenant's devices, one way or another, get none.
pub async fn cross_tenant_claims_get_nothing(c: &mut Cluster) {
    let a = &c.users["dra-a"];
    let own = class("dra-a", MIG_KIND);
    let theirs = class("dra-b", MIG_KIND);
    refused(
        "dra-a's claim for dra-b's class",
        create(a, "dra-a", &claim_body("x1", &theirs, 1, json!({}))).await,
        &["GpuTenant dra-a", &format!("may not name device class {theirs}"), &own],
    );
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "x2"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "mine", "deviceClassName": own}, {"name": "theirs", "deviceClassName": theirs}]}]}}}});
    refused(
        "dra-a's template with dra-b's class as an alternative",
        create(a, "dra-a", &template).await,
        &[&format!("may not name device class {theirs}")],
    );
    refused(
        "a claim for dra-a's class in a namespace of no tenant",
        create(&c.users[NONE_NS], NONE_NS, &claim_body("x3", &own, 1, json!({}))).await,
        &["belongs to no GpuTenant", &format!("may not name device class {own}")],
    );
    refused(
        "adminAccess (devices in use by other claims)",
        create(a, "dra-a", &claim_body("x4", &own, 1, json!({"adminAccess": true}))).await,
        &["dmin"],
    );
    refused(
        "a toleration of the not-ready device taint",
        create(
            a,
            "dra-a",
            &claim_body(
                "x5",
                &own,
                1,
                json!({"tolerations": [{"key": "gputenancy.io/not-ready", "operator": "Exists"}]}),
            ),
        )
        .await,
        &["may not tolerate gputenancy.io/not-ready"],
    );
    // The unhealthy taint, by key or by value, and every taint at once (no key).
    for (name, toleration) in [
        ("x5u", json!({"key": "gputenancy.io/unhealthy", "operator": "Exists"})),
        (
            "x5v",
            json!({"key": "gputenancy.io/unhealthy", "operator": "Equal", "value": "Xid", "effect": "NoSchedule"}),
        ),
        ("x5a", json!({"operator": "Exists"})),
    ] {
        refused(
            &format!("a toleration {toleration}"),
            create(
                a,
                "dra-a",
                &claim_body(name, &own, 1, json!({"tolerations": [toleration]})),
            )
            .await,
            &["may not tolerate gputenancy.io/not-ready or gputenancy.io/unhealthy"],
        );
    }
    let mut with_config = claim_body("x6", &own, 1, json!({}));
    with_config["spec"]["devices"]["config"] =
        json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"activeThreadPercentage": 100}}}]);
    refused(
        "parameters for this driver",
        create(a, "dra-a", &with_config).await,
        &[&format!("may not pass {DRIVER} parameters")],
    );
    // Its own class, narrowed to dra-b's devices: selectors only narrow a class, so nothing fits.
    let narrowed = claim_body(
        "x7",
        &own,
        1,
        json!({"selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].tenant == 'dra-b'")}}]}),
    );
    create(a, "dra-a", &narrowed).await.unwrap();
    create(
        a,
        "dra-a",
        &pod_body("x7", json!([{"name": "gpu", "resourceClaimName": "x7"}]), json!({})),
    )
    .await
    .unwrap();
    // A pod of dra-b naming dra-a's claim: a claim is found in the pod's own namespace only.
    let b = &c.users["dra-b"];
    create(
        b,
        "dra-b",
        &pod_body("x7", json!([{"name": "gpu", "resourceClaimName": "x7"}]), json!({})),
    )
    .await
    .unwrap();
    // An edit user cannot write an allocation into a claim's status.
    let forged = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": MIG_NODE, "device": "gpu-0-mig-6-1"}]}}}});
    let r = Api::<ResourceClaim>::namespaced(a.clone(), "dra-a")
        .patch_status("x7", &PatchParams::default(), &Patch::Merge(forged))
        .await;
    assert!(
        matches!(&r, Err(kube::Error::Api(e)) if e.code == 403),
        "an edit user wrote a claim's status: {r:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        allocation(&c.client, "dra-a", "x7").await,
        None,
        "the narrowed claim was allocated"
    );
    for ns in ["dra-a", "dra-b"] {
        let p = Api::<Pod>::namespaced(c.client.clone(), ns).get("x7").await.unwrap();
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.node_name, None, "pod {ns}/x7 was scheduled");
        let why = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .map(|c| format!("{} {}", c.reason.unwrap_or_default(), c.message.unwrap_or_default()));
        eprintln!("pending   pod {ns}/x7: {}", why.unwrap_or_default());
    }
    delete_pod(&c.client, "dra-a", "x7").await;
    delete_pod(&c.client, "dra-b", "x7").await;
    delete_claim(a, "dra-a", "x7").await;
}

/// Pods written for the device plugin: `nvidia.com/mig-1g.10gb` and `nvidia.com/gpu` in dra-a
/// (whose units of both are all on DRA nodes) are renamed to its own names and served by its
/// classes through the claim the scheduler makes; another tenant's names are refused.
pub async fn device_plugin_style_pods(c: &mut Cluster) {
    let a = &c.users["dra-a"];
    let kubelet = c.kubelets.get_mut(MIG_NODE).unwrap();
    let devices = devices(&c.client).await;
    for (pod, asked, renamed) in [
        ("dp1", "nvidia.com/mig-1g.10gb", "dra-a.gputenancy.io/mig-1g.10gb"),
        ("dp2", "nvidia.com/gpu", "dra-a.gputenancy.io/gpu"),
    ] {
        create(a, "dra-a", &pod_body(pod, json!([]), json!({asked: 1})))
            .await
            .unwrap_or_else(|e| panic!("the device-plugin-style pod {pod} ({asked}): {e}"));
        let p = Api::<Pod>::namespaced(c.client.clone(), "dra-a")
            .get(pod)
            .await
            .unwrap();
        let limits = p.spec.unwrap().containers[0].resources.clone().unwrap().limits.unwrap();
        assert!(
            limits.contains_key(renamed) && !limits.contains_key(asked),
            "{pod}: {asked} not renamed to {renamed}: {limits:?}"
        );
        let run = started(kubelet, "dra-a", pod, 60).await;
        let got: Vec<&String> = run.devices().collect();
        assert_eq!(got.len(), 1, "{pod}: {got:?}");
        let d = &devices[&(MIG_NODE.to_string(), got[0].clone())];
        assert_eq!(attr(d, "tenant"), &json!("dra-a"), "{pod} got {got:?}");
        eprintln!(
            "started   pod dra-a/{pod} asking {asked}: renamed {renamed}, prepared {}",
            got[0]
        );
    }
    refused(
        "dra-a's pod asking for dra-b's extended resource",
        create(
            a,
            "dra-a",
            &pod_body("dp3", json!([]), json!({"dra-b.gputenancy.io/mig-1g.10gb": 1})),
        )
        .await,
        &["may not use dra-b.gputenancy.io/mig-1g.10gb"],
    );
    let implicit = format!("deviceclass.resource.kubernetes.io/{}", class("dra-b", MIG_KIND));
    refused(
        "dra-a's pod asking for dra-b's class by its implicit name",
        create(a, "dra-a", &pod_body("dp4", json!([]), json!({implicit.clone(): 1}))).await,
        &[&format!("may not use {implicit}")],
    );
    refused(
        "a device-plugin-style pod in a namespace of no tenant",
        create(
            &c.users[NONE_NS],
            NONE_NS,
            &pod_body("dp5", json!([]), json!({"nvidia.com/mig-1g.10gb": 1})),
        )
        .await,
        &["belongs to no GpuTenant"],
    );
    let uids: Vec<String> = kubelet.running.keys().cloned().collect();
    for uid in uids {
        kubelet.finish(&uid).await;
    }
}

/// dra-c's four GPUs are two on NUMA node 0 and two on 1: with one of node 0 taken, a claim of two
/// with a `matchAttribute` constraint on `numaNode` gets node 1's pair.
pub async fn numa_constraint(c: &mut Cluster) {
    let u = &c.users["dra-c"];
    let cls = class("dra-c", "gpu");
    let kubelet = c.kubelets.get_mut(NUMA_NODE).unwrap();
    let devices = devices(&c.client).await;
    let numa = |d: &String| attr(&devices[&(NUMA_NODE.to_string(), d.clone())], "numaNode").clone();
    let first = claim_body(
        "n1",
        &cls,
        1,
        json!({"selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].numaNode == 0")}}]}),
    );
    create(u, "dra-c", &first).await.unwrap();
    create(
        u,
        "dra-c",
        &pod_body("n1", json!([{"name": "gpu", "resourceClaimName": "n1"}]), json!({})),
    )
    .await
    .unwrap();
    let one = started(kubelet, "dra-c", "n1", 60).await;
    let mut pair = claim_body("n2", &cls, 2, json!({}));
    pair["spec"]["devices"]["constraints"] =
        json!([{"requests": ["gpu"], "matchAttribute": format!("{DRIVER}/numaNode")}]);
    create(u, "dra-c", &pair).await.unwrap();
    create(
        u,
        "dra-c",
        &pod_body("n2", json!([{"name": "gpu", "resourceClaimName": "n2"}]), json!({})),
    )
    .await
    .unwrap();
    let two = started(kubelet, "dra-c", "n2", 60).await;
    let domains: Vec<Value> = two.devices().map(numa).collect();
    assert_eq!(
        domains,
        [json!(1), json!(1)],
        "the pair {:?} is not on one NUMA node",
        two.devices().collect::<Vec<_>>()
    );
    eprintln!(
        "started   dra-c/n1 on {:?} (NUMA {:?}); dra-c/n2 with matchAttribute numaNode on {:?} (NUMA {domains:?})",
        one.devices().collect::<Vec<_>>(),
        one.devices().map(numa).collect::<Vec<_>>(),
        two.devices().collect::<Vec<_>>()
    );
    for run in [one, two] {
        kubelet.finish(&run.uid).await;
        delete_claim(u, "dra-c", &run.name).await;
    }
}

fn dirt(agent: &gpu_tenancy_e2e::procs::SimAgent, gpu: usize) -> Vec<String> {
    agent.sim_state()["gpus"][gpu]["dirty"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str().map(String::from))
        .collect()
}

fn scrubs(agent: &gpu_tenancy_e2e::procs::SimAgent) -> usize {
    agent.sim_state()["scrubs"].as_array().map_or(0, |s| s.len())
}

/// dra-a's whole GPU goes to dra-b: dra-b's pod on it starts only once the GPU was scrubbed of
/// dra-a's data (the simulator's marks are gone when its Prepare returns).
pub async fn hand_over_waits_for_the_scrub(c: &mut Cluster) {
    let (a, b) = (&c.users["dra-a"], &c.users["dra-b"]);
    let agent = &c.agents[MIG_NODE];
    let kubelet = c.kubelets.get_mut(MIG_NODE).unwrap();
    create(a, "dra-a", &claim_body("h1", &class("dra-a", "gpu"), 1, json!({})))
        .await
        .unwrap();
    create(
        a,
        "dra-a",
        &pod_body("h1", json!([{"name": "gpu", "resourceClaimName": "h1"}]), json!({})),
    )
    .await
    .unwrap();
    let run = started(kubelet, "dra-a", "h1", 60).await;
    assert_eq!(run.devices().collect::<Vec<_>>(), ["gpu-1"]);
    agent.sim_ctl(&["dirty", "--gpu", "1", "--tenant", "dra-a"]);
    kubelet.finish(&run.uid).await;
    delete_claim(a, "dra-a", "h1").await;
    let scrubs_before = scrubs(agent);

    let t0 = Instant::now();
    let tenants = crate::support::tenants(&c.client);
    for (t, resources) in [
        ("dra-a", json!([{"mode": "MIG", "profile": "1g.10gb", "count": 4}])),
        (
            "dra-b",
            json!([{"mode": "MIG", "profile": "1g.10gb", "count": 3}, {"mode": "Exclusive", "count": 1}]),
        ),
    ] {
        tenants
            .patch(
                t,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": resources}})),
            )
            .await
            .unwrap();
    }
    let theirs = class("dra-b", "gpu");
    let claim = claim_body("h2", &theirs, 1, json!({}));
    // The class, quota and rules for dra-b's new GPU reach the API server a moment later.
    until("dra-b's claim of its new GPU admitted", 90, || {
        let (b, claim) = (b.clone(), claim.clone());
        async move { create(&b, "dra-b", &claim).await }
    })
    .await;
    create(
        b,
        "dra-b",
        &pod_body("h2", json!([{"name": "gpu", "resourceClaimName": "h2"}]), json!({})),
    )
    .await
    .unwrap();
    let run = started(kubelet, "dra-b", "h2", 120).await;
    let left = dirt(agent, 1);
    assert_eq!(run.devices().collect::<Vec<_>>(), ["gpu-1"]);
    assert!(
        left.is_empty(),
        "dra-b's pod started on GPU 1 with dra-a's data in it: {left:?}"
    );
    assert!(scrubs(agent) > scrubs_before, "GPU 1 changed hands without a scrub");
    eprintln!(
        "MEASURE GPU 1 from dra-a to dra-b: scrubbed ({} scrubs), dra-b's pod Running {:.1} s after the tenant change",
        scrubs(agent) - scrubs_before,
        t0.elapsed().as_secs_f64()
    );
    kubelet.finish(&run.uid).await;
    delete_claim(b, "dra-b", "h2").await;
}

/// A pod of a namespace of no tenant is never placed on a DRA node, though the DRA nodes carry no
/// node taint: while only they are Ready the scheduler finds no node for it (the node affinity the
/// controller's mutating policy added), and it is placed on a node without GPUs once one is.
pub async fn no_tenant_pods_stay_off_dra_nodes(c: &mut Cluster) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-only"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "10m"}}}]}});
    create(&c.users[NONE_NS], NONE_NS, &pod)
        .await
        .expect("a CPU pod of no tenant is admitted");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NONE_NS);
    let scheduled = |pods: Api<Pod>| async move {
        let p = pods.get("cpu-only").await.map_err(|e| e.to_string())?;
        let cond = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled");
        Ok::<_, String>((p.spec.and_then(|s| s.node_name), cond))
    };
    until("the scheduler finds no node for the pod of no tenant", 60, || {
        let pods = pods.clone();
        async move {
            match scheduled(pods).await? {
                (Some(node), _) => panic!("a pod of no tenant was placed on DRA node {node}"),
                (None, Some(c))
                    if c.status == "False" && c.message.as_deref().is_some_and(|m| m.contains("affinity")) =>
                {
                    eprintln!(
                        "MEASURE a pod of no tenant with only DRA nodes Ready: {}",
                        c.message.unwrap_or_default()
                    );
                    Ok(())
                }
                (None, c) => Err(format!("not judged yet: {c:?}")),
            }
        }
    })
    .await;
    let plain = "plain-n1";
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({"metadata": {"name": plain,
        "labels": {"kubernetes.io/hostname": plain}}}))
    .unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    nodes.create(&Default::default(), &node).await.unwrap();
    fake_ready(&c.client, plain).await;
    until("the pod of no tenant is placed on the node without GPUs", 60, || {
        let pods = pods.clone();
        async move {
            match scheduled(pods).await? {
                (Some(node), _) if node == plain => Ok(()),
                (Some(node), _) => panic!("a pod of no tenant was placed on DRA node {node}"),
                (None, c) => Err(format!("not placed yet: {c:?}")),
            }
        }
    })
    .await;
    delete_pod(&c.client, NONE_NS, "cpu-only").await;
    nodes.delete(plain, &Default::default()).await.unwrap();
}
