//! What a real agent (`gpu-tenancy agent run`) reads when it starts, counted in the control
//! plane's audit log: its watch's first event is for the GpuNode its first pass already read (or
//! created), and brings no second pass. A fleet joining at once made every agent read its GpuNode
//! and its Node twice, on the API server that was already the bottleneck (`make bench-fleet`).
//! And what a joining node writes: with empty GPUs declared, one spec and one status.

use crate::observe::{applied, apply_plan, wait_nodes};
use crate::support::*;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::procs::SimAgent;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

/// The completed requests in the audit log after byte `offset` on GpuNode `name` (its status
/// too) with `verb`.
fn requests(log: &Path, offset: u64, name: &str, verb: &str) -> Vec<Value> {
    requests_on(log, offset, "gpunodes", name, verb)
}

/// [`requests`] on the object `name` of `resource`.
fn requests_on(log: &Path, offset: u64, resource: &str, name: &str, verb: &str) -> Vec<Value> {
    let mut f = std::fs::File::open(log).unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    f.seek(SeekFrom::Start(offset)).expect("seeking in the audit log");
    let mut text = String::new();
    f.read_to_string(&mut text).expect("reading the audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["verb"] == verb
                && e["objectRef"]["resource"] == resource
                && e["objectRef"]["name"] == name
        })
        .collect()
}

/// The audit log the control plane of `e2e/run.sh` writes next to its kubeconfig.
fn audit_log() -> std::path::PathBuf {
    let log = gpu_tenancy_e2e::kubeconfig_path().with_file_name("audit.log");
    assert!(
        log.is_file(),
        "{} is missing: this test reads the audit log that e2e/controlplane writes next to its kubeconfig (run it with e2e/run.sh)",
        log.display()
    );
    log
}

fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// Waits until `done` (read from files: the audit log, the simulator's state, so the test's own
/// requests count nothing), failing with `what` after `secs`.
async fn wait_for(what: &str, secs: u64, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Long enough for the watch's first event to arrive and any pass it started to finish.
const SETTLE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_agent_reads_its_gpunode_once_when_it_creates_it_and_once_when_it_restarts() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = audit_log();
    let name = "reads-0";
    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 1}\n";
    // A poll far beyond the test, so every read counted comes from the start and the watch.
    let offset = log_len(&log);
    let mut agent = SimAgent::start_polling(&client, &cleanup, name, "reads", config, 600).await;
    // Waiting on the audit log, not on reads of the test's own that it would count.
    wait_for("the agent creating its GpuNode", 30, || {
        !requests(&log, offset, name, "create").is_empty()
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    // Its GPU holds nothing: it is declared on the GpuNode, and with no spec yet (no controller)
    // and no poll due, no status is written.
    assert_eq!(
        requests(&log, offset, name, "patch").len(),
        0,
        "the agent published a status before any spec or poll, though it declared its GPUs"
    );
    let gets = requests(&log, offset, name, "get").len();
    assert_eq!(
        gets, 1,
        "a new agent read GpuNode {name} {gets} times: once to find it missing is all (it created it, and the \
         watch's event for the created object is not a new spec)"
    );
    assert_eq!(
        requests(&log, offset, name, "create").len(),
        1,
        "the agent did not create its GpuNode once"
    );

    let declared = Api::<GpuNode>::all(client.clone()).get(name).await.unwrap();
    assert!(
        declared.found_gpus().is_some_and(|f| f.gpus.len() == 1),
        "GpuNode {name} does not declare the one GPU found: {:?}",
        declared.metadata.annotations
    );

    let offset = log_len(&log);
    agent.restart();
    tokio::time::sleep(SETTLE).await;
    let gets = requests(&log, offset, name, "get").len();
    assert_eq!(
        gets, 1,
        "a restarted agent read GpuNode {name} {gets} times: its first pass reads it, and the watch's first event \
         (the same generation) brings nothing new"
    );
    // A GpuNode it did not create in this life gets its status at once (the declaring is done
    // only by the pass that creates it).
    assert_eq!(
        requests(&log, offset, name, "patch").len(),
        1,
        "the restarted agent did not publish its status once"
    );
    assert!(agent.is_running(), "the agent stopped");
}

/// The agent's writes of GpuNode `name`'s status, and others' writes of its spec (the
/// controller's), after byte `offset` of the audit log.
fn status_and_spec_writes(log: &Path, offset: u64, name: &str) -> (usize, usize) {
    let patches = requests(log, offset, name, "patch");
    let status = patches
        .iter()
        .filter(|e| e["objectRef"]["subresource"] == "status")
        .count();
    (status, patches.len() - status)
}

/// A new node whose GPUs hold nothing is planned from what its agent declared on the GpuNode it
/// created: one spec from the controller, one status from the agent (the applied one), and the
/// status changes nothing in the plan. A node whose GPUs hold MIG instances declares nothing: it
/// publishes its status first, and is planned from it, keeping the instances.
#[tokio::test]
async fn a_new_node_with_empty_gpus_is_planned_from_its_declaration_and_writes_one_status() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = audit_log();
    let name = "join-0";
    cleanup.add("GpuPartitionPlan", "join");
    let c = std::sync::Arc::new(start_controller(&client).await);
    let controller = run_passes(c.clone());
    apply_plan(&client, mig_plan("join", json!(["3g.40gb", "3g.40gb"]))).await;
    let offset = log_len(&log);
    // No poll within the test: every status comes from a spec.
    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 2}\n";
    let mut agent = SimAgent::start_polling(&client, &cleanup, name, "join", config, 600).await;
    wait_nodes(
        &client,
        &[name.to_string()],
        60,
        "the new node's layout applied",
        applied,
    )
    .await;
    tokio::time::sleep(SETTLE).await;
    let (status, spec) = status_and_spec_writes(&log, offset, name);
    assert_eq!(
        (status, spec),
        (1, 1),
        "a new node with empty GPUs took (status writes, spec writes); want one spec planned from its declaration \
         and one status, the applied one"
    );
    // Both server-side applies (the controller's spec, the agent's status) ask the API server to
    // parse their body once: no strict second parse for warnings nobody reads.
    let strict: Vec<Value> = requests(&log, offset, name, "patch")
        .into_iter()
        .map(|e| e["requestURI"].clone())
        .filter(|uri| !uri.as_str().is_some_and(|u| u.contains("fieldValidation=Ignore")))
        .collect();
    assert!(
        strict.is_empty(),
        "applies to GpuNode {name} without fieldValidation=Ignore: {strict:?}"
    );
    let declared = |n: &GpuNode| {
        n.metadata
            .annotations
            .iter()
            .flatten()
            .any(|(k, _)| k == gpu_tenancy::api::FOUND_GPUS_ANNOTATION)
    };
    let gpu_node = Api::<GpuNode>::all(client.clone()).get(name).await.unwrap();
    assert!(
        declared(&gpu_node),
        "GpuNode {name} was not created with its GPUs declared"
    );
    let layout = |a: &SimAgent| -> Vec<Value> {
        let s = a.sim_state();
        s["gpus"].as_array().unwrap().iter().map(|g| g["gis"].clone()).collect()
    };
    let before = layout(&agent);
    assert!(
        before.iter().all(|g| g.as_array().is_some_and(|a| a.len() == 2)),
        "{before:?}"
    );

    // The agent stops and its GpuNode goes: the node comes back with two instances on each GPU.
    agent.kill();
    Api::<GpuNode>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .expect("the test deletes the GpuNode");
    tokio::time::sleep(SETTLE).await;
    let offset = log_len(&log);
    agent.restart();
    wait_nodes(&client, &[name.to_string()], 60, "the node back and applied", applied).await;
    tokio::time::sleep(SETTLE).await;
    let back = Api::<GpuNode>::all(client.clone()).get(name).await.unwrap();
    assert!(
        !declared(&back),
        "GPUs holding MIG instances were declared: {:?}",
        back.metadata.annotations
    );
    let (status, spec) = status_and_spec_writes(&log, offset, name);
    assert!(
        status >= 2 && spec == 1,
        "a node with instances took {status} status writes and {spec} spec writes: want its status first, then \
         the spec planned from it, then the applied status"
    );
    assert_eq!(
        layout(&agent),
        before,
        "the plan made from the status did not keep the instances the GPUs held"
    );
    controller.abort();
}

/// A declared node's first status waits for its spec: polls that find its GPUs as declared
/// publish nothing (while a fleet joins, the controller's pass writing the specs can outlast a
/// poll), one that finds a process on them publishes at once (the controller must plan from what
/// runs), and a node no spec ever comes to (no controller here) publishes after 10 polls.
#[tokio::test]
async fn a_declared_node_waits_for_its_spec_unless_its_gpus_change_or_no_spec_comes() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = audit_log();
    let (busy, idle) = ("declared-busy", "declared-idle");
    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 1}\n";
    let offset = log_len(&log);
    // Polls a second apart; no controller, so no spec comes.
    let agent_busy = SimAgent::start_polling(&client, &cleanup, busy, "declared", config, 1).await;
    let mut agent_idle = SimAgent::start_polling(&client, &cleanup, idle, "declared", config, 1).await;
    wait_for("both agents creating their GpuNodes", 30, || {
        [busy, idle]
            .iter()
            .all(|n| !requests(&log, offset, n, "create").is_empty())
    })
    .await;
    let created = Instant::now();
    // About four polls, each reading GPUs that are as declared.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for n in [busy, idle] {
        assert_eq!(
            status_and_spec_writes(&log, offset, n),
            (0, 0),
            "agent {n} published a status at a poll before any spec, though its GPUs are as it declared them"
        );
    }

    // A process starts on the busy node's GPU: its declaration no longer says what runs.
    agent_busy.sim_ctl(&["attach", "--gpu", "0", "--pid", "4243", "--tenant", "someone"]);
    wait_for("a poll publishing the busy node's status", 10, || {
        status_and_spec_writes(&log, offset, busy).0 >= 1
    })
    .await;
    let api: Api<GpuNode> = Api::all(client.clone());
    let published = api.get(busy).await.expect("reading the busy node's GpuNode");
    assert!(
        published.found_gpus().is_none(),
        "GpuNode {busy}'s declaration is still read after the agent published its status"
    );
    let st = published.status.unwrap_or_default();
    assert!(
        st.gpus
            .first()
            .is_some_and(|g| g.processes.iter().any(|p| p.pid == 4243)),
        "the status published for the process does not show it: {:?}",
        st.gpus
    );

    // No spec comes to the idle node: its status after its patience, ten polls, not before.
    wait_for("the idle node's status once no spec came", 30, || {
        status_and_spec_writes(&log, offset, idle).0 >= 1
    })
    .await;
    let waited = created.elapsed();
    assert!(
        waited >= Duration::from_secs(8),
        "the idle node published its first status {waited:?} after joining: want about ten polls (10 s)"
    );
    assert!(
        api.get(idle)
            .await
            .expect("reading the idle node's GpuNode")
            .status
            .is_some_and(|s| s.gpu_count == Some(1)),
        "the idle node's status does not show its GPU"
    );
    assert!(agent_idle.is_running(), "the idle node's agent stopped");
}

/// The agent's reads of its GpuNode and its Node after byte `offset` of the audit log.
fn agent_gets(log: &Path, offset: u64, name: &str) -> (usize, usize) {
    (
        requests_on(log, offset, "gpunodes", name, "get").len(),
        requests_on(log, offset, "nodes", name, "get").len(),
    )
}

/// GPU instances on the simulated GPU 0, as the simulator holds them (read from its state file,
/// not from the API server, so the test's own reads count nothing).
fn instances_on_gpu0(agent: &SimAgent) -> usize {
    agent.sim_state()["gpus"][0]["gis"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_new_spec_and_idle_polls_read_nothing_yet_drift_is_repaired_and_a_deleted_gpunode_comes_back() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = audit_log();
    let name = "reads-1";
    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 1}\n";
    let mut agent = SimAgent::start_polling(&client, &cleanup, name, "reads", config, 1).await;
    let api: Api<GpuNode> = Api::all(client.clone());
    // Its first status: no spec comes (no controller), so a poll publishes it once the agent's
    // patience for a spec is over (ten polls).
    wait_nodes(&client, &[name.to_string()], 30, "the agent's first status", |n| {
        n.status.as_ref().is_some_and(|s| !s.is_unpublished())
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    // A spec as the controller writes it: one instance on GPU 0. The watch brings it whole: the
    // pass that applies it reads nothing.
    let offset = log_len(&log);
    let spec = json!({"gpus": [{"index": 0, "mode": "MIG", "migInstances": [
        {"profile": "3g.40gb", "placement": {"start": 4, "size": 4}, "tenant": "a"}]}]});
    api.patch(
        name,
        &PatchParams::apply("e2e-reads").force(),
        &Patch::Apply(json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": name}, "spec": spec})),
    )
    .await
    .expect("the test writes the GpuNode spec");
    wait_for("the spec's instance and the agent's status", 30, || {
        instances_on_gpu0(&agent) == 1 && requests(&log, offset, name, "patch").len() >= 2
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        agent_gets(&log, offset, name),
        (0, 0),
        "applying a new spec read the GpuNode or the Node (gets of each): the watch brought the spec, the status is the agent's own"
    );
    wait_nodes(&client, &[name.to_string()], 60, "the spec applied", applied).await;
    assert_eq!(
        instances_on_gpu0(&agent),
        1,
        "the spec's instance is not on the simulated GPU"
    );
    tokio::time::sleep(SETTLE).await;

    // Idle for about four polls: NVML is read each time, the API server not at all.
    let offset = log_len(&log);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        agent_gets(&log, offset, name),
        (0, 0),
        "idle polls read the GpuNode and the Node (gets of each): a poll needs only what the last pass read and wrote"
    );

    // A reboot takes the instance away: the next poll, reading nothing, puts it back. The agent
    // polls every second, so the instance may be back before the test looks: the simulator's
    // log of NVML mutations after the reboot, holding a creation on GPU 0, is what shows that
    // the reboot took it and a poll put it back.
    let before_reboot = agent.mutations();
    agent.sim_ctl(&["reboot"]);
    wait_for("a poll putting the instance back after the reboot", 20, || {
        instances_on_gpu0(&agent) == 1
            && agent.sim_log(before_reboot).iter().any(|e| {
                e["gpu"] == 0
                    && e["call"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("nvmlDeviceCreateGpuInstance"))
            })
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        agent_gets(&log, offset, name),
        (0, 0),
        "repairing drift read the GpuNode or the Node (gets of each)"
    );
    assert!(
        !requests(&log, offset, name, "patch").is_empty(),
        "the repair was not published in the GpuNode's status"
    );

    // Deleted: the watch says so, and the next pass reads it (missing) and creates it again.
    let offset = log_len(&log);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("the test deletes the GpuNode");
    wait_for("the agent creating its deleted GpuNode again", 30, || {
        !requests(&log, offset, name, "create").is_empty()
    })
    .await;
    wait_nodes(
        &client,
        &[name.to_string()],
        30,
        "the GpuNode back with a status",
        |n| n.status.is_some(),
    )
    .await;
    assert!(agent.is_running(), "the agent stopped");
}
