//! The controller with several real agents (`gpu-tenancy agent run`, each on simulated GPUs of its
//! own): what the GPUs went through is read from the simulator's own mutation and scrub logs, and
//! what the cluster showed from watches of the GpuNodes and Nodes, replayed revision by revision.
//!
//! Expected NVML mutations are worked out by hand from the MIG layouts (profile IDs from NVIDIA's
//! tables: 3g.40gb is 9, 2g.20gb is 14, 7g.80gb is 0), never from the agent's own plan.

use crate::observe::*;
use crate::support::*;
use gpu_tenancy::api::{GpuNode, GpuPartitionPlan, GpuTenant, ScrubResult};
use gpu_tenancy::labels::SCRUB_PENDING;
use gpu_tenancy_e2e::procs::SimAgent;
use gpu_tenancy_e2e::{Cleanup, apply_file};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A plan change reaches three nodes with real agents one node at a time (`maxUnavailable: 1`),
/// and each agent makes exactly the NVML calls its GPU's diff needs: GPU 1, whose layout stays,
/// gets none. Then an idle period makes no mutation and no GpuNode write.
#[tokio::test]
async fn rollout_on_real_agents_touches_only_what_changed() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    cleanup.add("GpuPartitionPlan", "ro");
    let names: Vec<String> = (0..3).map(|i| format!("ro-{i}")).collect();
    let mut agents = Vec::new();
    for n in &names {
        agents.push(SimAgent::start_with(&client, &cleanup, n, "ro", 2).await);
    }
    let plan = |gpu0: Value| {
        json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": "ro"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "ro"}},
                "gpus": [{"devices": "0", "mode": "MIG", "mig": {"profiles": gpu0}},
                         {"devices": "1", "mode": "MIG", "mig": {"profiles": ["7g.80gb"]}}],
                "rollout": {"maxUnavailable": 1, "busyGpuPolicy": "Wait"}}})
    };
    let c = Arc::new(start_controller(&client).await);
    let controller = run_passes(c.clone());
    let t0 = Instant::now();
    apply_plan(&client, plan(json!(["3g.40gb", "3g.40gb"]))).await;
    let want = |gpu0: &[&str]| {
        let gpu0: Vec<String> = gpu0.iter().map(|s| s.to_string()).collect();
        move |n: &GpuNode| {
            applied(n) && reported_profiles(n) == BTreeMap::from([(0, gpu0.clone()), (1, vec!["7g.80gb".to_string()])])
        }
    };
    wait_nodes(
        &client,
        &names,
        60,
        "the first layout applied",
        want(&["3g.40gb", "3g.40gb"]),
    )
    .await;
    eprintln!(
        "MEASURE first layout on 3 nodes x 2 GPUs (real agents): {:?}",
        t0.elapsed()
    );
    // Each agent wrote its node's one GPU model's MIG profiles once, and the API server kept them
    // (the CRD names the field): every GPU reads its table through them.
    for n in &names {
        let gn = Api::<GpuNode>::all(client.clone()).get(n).await.unwrap();
        let s = gn.status.as_ref().expect("a status");
        let models: Vec<&str> = s.mig_profiles.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(models.len(), 1, "{n}: one model's table, got {models:?}");
        for g in &s.gpus {
            assert!(g.profiles.is_empty(), "{n}: GPU {} kept its own table", g.index);
            assert!(!s.profiles_of(g).is_empty(), "{n}: GPU {} reads no table", g.index);
        }
    }
    let before: Vec<u64> = agents.iter().map(|a| a.mutations()).collect();
    let first_state: Vec<Value> = agents.iter().map(|a| a.sim_state()).collect();

    // GPU 0 trades one 3g.40gb for two 2g.20gb; GPU 1 stays 7g.80gb.
    let gpu_nodes = Versions::watch(Api::<GpuNode>::all(client.clone())).await;
    let nodes = Versions::watch(Api::<Node>::all(client.clone())).await;
    let t1 = Instant::now();
    let changed_at = apply_plan(&client, plan(json!(["3g.40gb", "2g.20gb", "2g.20gb"]))).await;
    wait_nodes(
        &client,
        &names,
        60,
        "the new layout applied",
        want(&["2g.20gb", "2g.20gb", "3g.40gb"]),
    )
    .await;
    let rollout = t1.elapsed();
    for n in &names {
        let now = Api::<GpuNode>::all(client.clone()).get(n).await.unwrap();
        gpu_nodes.until_seen(n, resource_version(&now)).await;
    }

    // At every revision since the change, at most one node of the pool had a spec not yet applied.
    let (gn_versions, node_versions) = (gpu_nodes.stop(), nodes.stop());
    let seen = moments(&gn_versions, &node_versions, changed_at);
    let mut most = 0;
    let mut started = BTreeMap::new();
    for m in &seen {
        let unapplied: Vec<&String> = names
            .iter()
            .filter(|n| m.gpu_nodes.get(*n).is_some_and(|g| !applied(g)))
            .collect();
        assert!(
            unapplied.len() <= 1,
            "at revision {} more than maxUnavailable nodes were changing: {unapplied:?}",
            m.revision
        );
        most = most.max(unapplied.len());
        for n in unapplied {
            started.entry(n.clone()).or_insert(m.revision);
        }
    }
    assert_eq!(started.len(), 3, "every node went through the change: {started:?}");
    eprintln!(
        "MEASURE rollout of a one-GPU change to 3 nodes at maxUnavailable 1 (real agents): {rollout:?}, {} revisions watched, at most {most} node changing at once, nodes started at revisions {started:?}",
        seen.len()
    );

    // What each simulated node went through, from its own log.
    for (i, a) in agents.iter().enumerate() {
        let log = a.sim_log(before[i]);
        let calls = per_gpu(&log);
        assert_eq!(
            calls.get(&1),
            None,
            "{}: GPU 1's layout did not change, yet: {log:#?}",
            names[i]
        );
        assert_eq!(
            calls.get(&0),
            Some(&one_instance_to_two()),
            "{}: GPU 0 replaces one 3g.40gb by two 2g.20gb: {log:#?}",
            names[i]
        );
        // The destroyed instance is a 3g.40gb (profile 9), the created ones 2g.20gb (14), and the
        // kept 3g.40gb is the same GPU instance as before.
        for e in &log {
            let d = e["detail"].as_str().unwrap();
            match e["call"].as_str().unwrap() {
                "nvmlGpuInstanceDestroy" => assert!(d.contains("profile=9 "), "{d}"),
                "nvmlDeviceCreateGpuInstanceWithPlacement" => assert!(d.contains("profile=14 "), "{d}"),
                _ => {}
            }
        }
        let now = a.sim_state();
        assert_eq!(
            sim_profiles(&now),
            BTreeMap::from([(0, vec![9, 14, 14]), (1, vec![0])]),
            "{}",
            names[i]
        );
        let kept = |s: &Value| -> Vec<Value> {
            s["gpus"][0]["gis"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|gi| gi["profile_id"] == 9)
                .cloned()
                .collect()
        };
        let was = kept(&first_state[i]);
        assert!(
            kept(&now).iter().all(|gi| was.contains(gi)),
            "{}: the kept 3g.40gb is the one that ran before",
            names[i]
        );
        assert_eq!(
            first_state[i]["gpus"][1]["gis"], now["gpus"][1]["gis"],
            "{}: GPU 1's instance is untouched",
            names[i]
        );
    }

    // Idle: three agent polls and the controller's passes change nothing.
    let gn_api: Api<GpuNode> = Api::all(client.clone());
    let rv = |client: Api<GpuNode>| async move {
        let mut out = Vec::new();
        for n in ["ro-0", "ro-1", "ro-2"] {
            let mut g = client.get(n).await.unwrap();
            g.metadata.managed_fields = None;
            out.push(serde_json::to_string_pretty(&g).unwrap());
        }
        out
    };
    let idle_from: Vec<u64> = agents.iter().map(|a| a.mutations()).collect();
    let rvs = rv(gn_api.clone()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (i, a) in agents.iter().enumerate() {
        let log = a.sim_log(idle_from[i]);
        assert!(log.is_empty(), "{}: mutations while idle: {log:#?}", names[i]);
    }
    let after = rv(gn_api).await;
    for (a, b) in rvs.iter().zip(&after) {
        assert!(a == b, "a GpuNode was written while idle: before {a} after {b}");
    }
    eprintln!("MEASURE idle 3 s on 3 real agents: 0 NVML mutations, 0 GpuNode writes");
    controller.abort();
    drop(agents);
    Api::<GpuPartitionPlan>::all(client.clone())
        .delete("ro", &DeleteParams::default())
        .await
        .ok();
}

/// An agent killed (the simulator aborts it right after a chosen NVML call) while an instance's
/// memory changes hands from kill-a to kill-b, then restarted on the same GPU: the hand-over is
/// never reported before kill-b's scrub, the node stays tainted until then, the simulator records
/// the scrub of each device kill-b gets, and the node converges Ready.
#[tokio::test]
async fn killed_mid_handover_converges_after_restart_never_unscrubbed() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    apply_file("examples/policy.yaml").await;
    for (kind, name) in [
        ("GpuPartitionPlan", "kill"),
        ("GpuTenant", "kill-a"),
        ("GpuTenant", "kill-b"),
    ] {
        cleanup.add(kind, name);
    }
    let tenants: Api<GpuTenant> = Api::all(client.clone());
    let tenant = |name: &'static str, resources: Value| {
        let tenants = tenants.clone();
        async move {
            let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": name},
                "spec": {"tier": "internal", "namespaces": [name], "resources": resources}});
            tenants
                .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(body))
                .await
                .unwrap();
        }
    };
    tenant("kill-a", json!([{"mode": "MIG", "profile": "3g.40gb", "count": 2}])).await;
    tenant("kill-b", json!([])).await;
    let plan = |profiles: Value| {
        let mut p = mig_plan("kill", profiles);
        p["spec"]["gpus"][0]["tenants"] = json!(["kill-a", "kill-b"]);
        p
    };
    apply_plan(&client, plan(json!(["3g.40gb", "3g.40gb"]))).await;
    let mut agent = SimAgent::start(&client, &cleanup, "kill-0", "kill").await;
    let c = Arc::new(start_controller(&client).await);
    let controller = run_passes(c.clone());
    let node = vec!["kill-0".to_string()];
    let tenants_of = |n: &GpuNode| -> Vec<Option<String>> {
        n.status
            .iter()
            .flat_map(|s| &s.gpus)
            .flat_map(|g| g.instances.iter().map(|i| i.tenant.clone()))
            .collect()
    };
    wait_nodes(&client, &node, 60, "kill-a's two instances applied", |n| {
        applied(n) && tenants_of(n) == [Some("kill-a".to_string()), Some("kill-a".to_string())]
    })
    .await;
    // The first hand-over (to kill-a) is over: the node is untainted before the next one.
    let nodes_api: Api<Node> = Api::all(client.clone());
    wait_untainted(&client, "kill-0", "kill-a's hand-over").await;
    // kill-a's workloads leave data in both instances.
    for (start, pid) in [("0", "6161"), ("4", "6162")] {
        agent.sim_ctl(&[
            "attach", "--gpu", "0", "--start", start, "--pid", pid, "--tenant", "kill-a",
        ]);
        agent.sim_ctl(&["detach", "--pid", pid]);
    }
    let st = agent.sim_state();
    let (before, scrubs_before) = (
        st["mutations"].as_u64().unwrap(),
        st["scrubs"].as_array().unwrap().len(),
    );

    // One change, made while the controller is paused so it reaches the agent whole: kill-a keeps
    // one 3g.40gb, the other becomes two 2g.20gb for kill-b. The agent dies right after its third
    // NVML call: the 3g.40gb's compute and GPU instance are destroyed, one 2g.20gb GPU instance
    // is created, its compute instance is not.
    controller.abort();
    agent.sim_ctl(&["abort-at", "--mutation", "3"]);
    let gpu_nodes = Versions::watch(Api::<GpuNode>::all(client.clone())).await;
    let nodes = Versions::watch(Api::<Node>::all(client.clone())).await;
    let changed_at = apply_plan(&client, plan(json!(["3g.40gb", "2g.20gb", "2g.20gb"]))).await;
    tenant("kill-a", json!([{"mode": "MIG", "profile": "3g.40gb", "count": 1}])).await;
    tenant("kill-b", json!([{"mode": "MIG", "profile": "2g.20gb", "count": 2}])).await;
    let t0 = Instant::now();
    let controller = run_passes(c.clone());
    let died = agent
        .exited(Duration::from_secs(60))
        .await
        .expect("the agent reached the abort point within 60 s");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        died.signal(),
        Some(6),
        "the agent was aborted by the simulator (SIGABRT): {died:?}"
    );
    let at_death = agent.sim_log(before);
    let calls: Vec<&str> = at_death.iter().map(|e| e["call"].as_str().unwrap()).collect();
    assert_eq!(
        calls,
        [
            "nvmlComputeInstanceDestroy",
            "nvmlGpuInstanceDestroy",
            "nvmlDeviceCreateGpuInstanceWithPlacement"
        ],
        "{at_death:#?}"
    );
    // Dead for a few of its poll periods, as a crash-looping pod is; then back on the same GPU,
    // where its first scrub fails (one CUDA allocation fails): the hand-over it publishes then is
    // unfinished, and must show as such. Back with a poll of 10 minutes, longer than the wait
    // below: the failed scrub is tried again within seconds (with backoff), not at the next poll
    // (nothing else wakes the agent: the spec does not change).
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.sim_ctl(&[
        "fail",
        "--call",
        "cuMemAlloc_v2",
        "--gpu",
        "0",
        "--error",
        "UNKNOWN",
        "--times",
        "1",
    ]);
    agent.poll = 600;
    agent.restart();
    let b = Some("kill-b".to_string());
    wait_nodes(
        &client,
        &node,
        60,
        "kill-b's instances applied after the restart",
        |n| {
            let mut t = tenants_of(n);
            t.sort();
            applied(n) && t == [Some("kill-a".to_string()), b.clone(), b.clone()]
        },
    )
    .await;
    wait_untainted(&client, "kill-0", "the hand-over").await;
    let converged = t0.elapsed();
    let untainted = nodes_api.get("kill-0").await.unwrap();
    nodes.until_seen("kill-0", resource_version(&untainted)).await;
    let (gn_versions, node_versions) = (gpu_nodes.stop(), nodes.stop());

    // Replayed revision by revision: nothing of kill-b's shows before its scrub, and the node is
    // tainted from the spec that hands the memory over until the status shows it scrubbed.
    let scrubbed_for_b = |n: &GpuNode, start: u32| {
        n.status
            .iter()
            .flat_map(|s| &s.gpus)
            .flat_map(|g| &g.instances)
            .any(|i| {
                i.placement.start == start
                    && i.last_scrub
                        .as_ref()
                        .is_some_and(|s| s.result == ScrubResult::Scrubbed && s.tenant.as_deref() == Some("kill-b"))
            })
    };
    let (mut tainted_moments, mut handing_over, mut reported_unfinished) = (0, 0, 0);
    let seen = moments(&gn_versions, &node_versions, changed_at);
    for m in &seen {
        let (Some(gn), Some(n)) = (m.gpu_nodes.get("kill-0"), m.nodes.get("kill-0")) else {
            continue;
        };
        let for_b: Vec<u32> = gn
            .spec
            .gpus
            .iter()
            .flat_map(|g| &g.mig_instances)
            .filter(|i| i.tenant.as_deref() == Some("kill-b"))
            .map(|i| i.placement.start)
            .collect();
        let unscrubbed: Vec<u32> = for_b.iter().copied().filter(|s| !scrubbed_for_b(gn, *s)).collect();
        eprintln!(
            "revision {}: generation {:?} observed {:?} Ready {:?} GPU 0 {:?} instances {:?} tainted {}",
            m.revision,
            gn.metadata.generation,
            gn.status.as_ref().and_then(|s| s.observed_generation),
            condition(gn, "Ready").map(|c| &c.status),
            gn.status
                .iter()
                .flat_map(|s| &s.gpus)
                .map(|g| (&g.reason, &g.message))
                .next(),
            gn.status
                .iter()
                .flat_map(|s| &s.gpus)
                .flat_map(|g| &g.instances)
                .map(|i| (
                    i.placement.to_string(),
                    &i.tenant,
                    i.last_scrub.as_ref().map(|s| (&s.result, &s.tenant))
                ))
                .collect::<Vec<_>>(),
            scrub_tainted(n)
        );
        for i in gn.status.iter().flat_map(|s| &s.gpus).flat_map(|g| &g.instances) {
            assert!(
                i.tenant.as_deref() != Some("kill-b") || scrubbed_for_b(gn, i.placement.start),
                "at revision {} the instance at {} is reported kill-b's before its scrub: {:#?}",
                m.revision,
                i.placement,
                gn.status
            );
        }
        assert!(
            unscrubbed.is_empty() || !applied(gn),
            "at revision {} the node is Ready while kill-b's instances at {unscrubbed:?} are not scrubbed: {:#?}",
            m.revision,
            gn.status
        );
        assert!(
            unscrubbed.is_empty() || scrub_tainted(n),
            "at revision {} the spec hands instances at {unscrubbed:?} to kill-b, they are not scrubbed, and Node kill-0 has no {SCRUB_PENDING} taint",
            m.revision
        );
        tainted_moments += usize::from(scrub_tainted(n));
        handing_over += usize::from(!unscrubbed.is_empty());
        let reported = gn.status.as_ref().and_then(|s| s.observed_generation) == gn.metadata.generation;
        reported_unfinished += usize::from(!unscrubbed.is_empty() && reported);
    }
    assert!(
        reported_unfinished > 0,
        "no revision showed the agent's report of the unfinished hand-over (after the failed scrub): the checks above saw only the spec"
    );

    // The simulator's own record: kill-b's two instances were scrubbed (zeroed through CUDA),
    // none of kill-a's data is left in them, and the change took exactly the NVML calls of its
    // diff across both lives of the agent (nothing done twice).
    let st = agent.sim_state();
    let gpu = &st["gpus"][0];
    let final_gn = Api::<GpuNode>::all(client.clone()).get("kill-0").await.unwrap();
    let b_starts: Vec<u32> = final_gn
        .status
        .iter()
        .flat_map(|s| &s.gpus)
        .flat_map(|g| &g.instances)
        .filter(|i| i.tenant.as_deref() == Some("kill-b"))
        .map(|i| i.placement.start)
        .collect();
    let new_scrubs = &st["scrubs"].as_array().unwrap()[scrubs_before..];
    for start in &b_starts {
        let gi = gpu["gis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|gi| gi["start"] == *start)
            .unwrap_or_else(|| panic!("no GPU instance at {start} in the simulator: {gpu:#}"));
        assert!(
            new_scrubs
                .iter()
                .any(|s| s["gpu"] == 0 && s["gpu_instance"] == gi["id"]),
            "the simulator recorded no scrub of kill-b's instance at {start} (GI {}): {new_scrubs:#?}",
            gi["id"]
        );
        let size = gi["size"].as_u64().unwrap() as usize;
        let slices = &gpu["dirty"].as_array().unwrap()[*start as usize..*start as usize + size];
        assert!(
            slices.iter().all(|s| s != "kill-a"),
            "kill-a's data is left in kill-b's instance at {start}: {slices:?}"
        );
    }
    assert_eq!(b_starts.len(), 2, "{:#?}", final_gn.status);
    assert_eq!(
        per_gpu(&agent.sim_log(before)).get(&0),
        Some(&one_instance_to_two()),
        "{:#?}",
        agent.sim_log(before)
    );
    eprintln!(
        "MEASURE agent killed after NVML call 3 of 6 mid hand-over: converged Ready and untainted {converged:?} after the change, {} revisions checked ({handing_over} with the hand-over in progress, {reported_unfinished} of them reported by the agent, {tainted_moments} with the taint), {} scrubs recorded by the simulator",
        seen.len(),
        new_scrubs.len()
    );
    controller.abort();
    drop(agent);
    Api::<GpuPartitionPlan>::all(client.clone())
        .delete("kill", &DeleteParams::default())
        .await
        .ok();
}

/// `busyGpuPolicy: Wait` with a real agent: a process runs on GPU 0 when its layout changes, so the
/// agent leaves it as it is (no NVML call on it, the node Reconciling and naming the pid) while GPU
/// 1 changes; once the process ends, GPU 0 changes too and the node is Ready.
#[tokio::test]
async fn busy_gpu_under_wait_changes_when_its_process_ends() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    cleanup.add("GpuPartitionPlan", "wait");
    let agent = SimAgent::start_with(&client, &cleanup, "wait-0", "wait", 2).await;
    let plan = |profiles: Value| {
        let mut p = mig_plan("wait", profiles);
        p["spec"]["rollout"]["busyGpuPolicy"] = json!("Wait");
        p
    };
    let controller = run_passes(Arc::new(start_controller(&client).await));
    apply_plan(&client, plan(json!(["7g.80gb"]))).await;
    let node = vec!["wait-0".to_string()];
    let layout = |gpu0: &'static [&'static str], gpu1: &'static [&'static str]| {
        move |n: &GpuNode| {
            reported_profiles(n)
                == BTreeMap::from([
                    (0, gpu0.iter().map(|s| s.to_string()).collect()),
                    (1, gpu1.iter().map(|s| s.to_string()).collect()),
                ])
        }
    };
    let whole = layout(&["7g.80gb"], &["7g.80gb"]);
    wait_nodes(&client, &node, 60, "7g.80gb on both GPUs", |n| applied(n) && whole(n)).await;
    agent.sim_ctl(&["attach", "--gpu", "0", "--start", "0", "--pid", "4343"]);
    let before = agent.mutations();

    apply_plan(&client, plan(json!(["3g.40gb", "3g.40gb"]))).await;
    let half = layout(&["7g.80gb"], &["3g.40gb", "3g.40gb"]);
    wait_nodes(&client, &node, 60, "GPU 1 changed, GPU 0 waiting", |n| {
        let g0 = n.status.iter().flat_map(|s| &s.gpus).find(|g| g.index == 0);
        n.status.as_ref().and_then(|s| s.observed_generation) == n.metadata.generation
            && half(n)
            && g0.is_some_and(|g| g.reason.map(|r| r.as_str()) == Some("Busy") && g.applied == Some(false))
    })
    .await;
    // Three more polls while the process runs: still nothing on GPU 0, and the waiting agent
    // rewrites no status (no hot loop while it waits).
    let waiting_since = Api::<GpuNode>::all(client.clone()).get("wait-0").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = Api::<GpuNode>::all(client.clone()).get("wait-0").await.unwrap();
    assert_eq!(
        n.resource_version(),
        waiting_since.resource_version(),
        "GpuNode wait-0 was written while nothing changed: {:#?} then {:#?}",
        waiting_since.status,
        n.status
    );
    let g0 = n
        .status
        .as_ref()
        .unwrap()
        .gpus
        .iter()
        .find(|g| g.index == 0)
        .unwrap()
        .clone();
    assert!(
        g0.message.as_deref().is_some_and(|m| m.contains("4343")),
        "GPU 0's message names the busy pid: {g0:?}"
    );
    let reconciling = condition(&n, "Reconciling").expect("a Reconciling condition");
    assert_eq!(reconciling.status, "True", "{reconciling:?}");
    assert_eq!(reconciling.reason, "Waiting", "{reconciling:?}");
    assert!(
        reconciling.message.contains("4343"),
        "the node's Reconciling message names the busy pid: {reconciling:?}"
    );
    let ready = condition(&n, "Ready").expect("a Ready condition");
    assert_eq!(ready.status, "False", "{ready:?}");
    let while_busy = agent.sim_log(before);
    let calls = per_gpu(&while_busy);
    assert_eq!(
        calls.get(&0),
        None,
        "an NVML mutation on GPU 0 while its process runs: {while_busy:#?}"
    );
    // GPU 1: its 7g.80gb replaced by two 3g.40gb (destroy 1 CI and 1 GI, create 2 of each).
    let seven_to_two_3g = one_instance_to_two();
    assert_eq!(calls.get(&1), Some(&seven_to_two_3g), "{while_busy:#?}");
    assert_eq!(
        sim_profiles(&agent.sim_state()).get(&0),
        Some(&vec![0]),
        "GPU 0 keeps its 7g.80gb while busy"
    );

    // The process ends: GPU 0 changes in the same way, and the node is Ready.
    let t0 = Instant::now();
    let during = agent.mutations();
    agent.sim_ctl(&["detach", "--pid", "4343"]);
    let split = layout(&["3g.40gb", "3g.40gb"], &["3g.40gb", "3g.40gb"]);
    wait_nodes(&client, &node, 60, "GPU 0 changed after its process ended", |n| {
        applied(n) && split(n)
    })
    .await;
    let after = agent.sim_log(during);
    assert_eq!(
        per_gpu(&after),
        BTreeMap::from([(0, seven_to_two_3g.clone())]),
        "{after:#?}"
    );
    assert_eq!(
        sim_profiles(&agent.sim_state()),
        BTreeMap::from([(0, vec![9, 9]), (1, vec![9, 9])])
    );
    let n = Api::<GpuNode>::all(client.clone()).get("wait-0").await.unwrap();
    assert_eq!(condition(&n, "Reconciling").map(|c| c.status.as_str()), Some("False"));
    eprintln!(
        "MEASURE busy GPU under Wait: 0 mutations on it while busy, changed {:?} after its process ended",
        t0.elapsed()
    );
    controller.abort();
    drop(agent);
    Api::<GpuPartitionPlan>::all(client.clone())
        .delete("wait", &DeleteParams::default())
        .await
        .ok();
}
