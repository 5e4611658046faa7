//! The fleet's in-memory backend under the agent's real `apply`, and the generator under the real
//! planner (`gpu-tenancy plan`). They use the debug binaries (`cargo build --workspace` first, as
//! `make unit` does): the GPU models come from one discovery of the simulated NVML library.

use crate::backend::{MemGpus, ModelTemplate, Tally, Trouble};
use crate::generate::{self, Model, Pool};
use gpu_tenancy::api::{GpuNodeSpec, GpuNodeStatus};
use gpu_tenancy::gpu::Gpus;
use gpu_tenancy::gpu::apply::{ApplyOptions, apply};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn target_debug() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gt-fleet-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

fn templates() -> &'static BTreeMap<Model, ModelTemplate> {
    static T: OnceLock<BTreeMap<Model, ModelTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let d = target_debug();
        crate::templates::discover(
            &d.join("gpu-tenancy"),
            &d.join("libnvidia_ml_sim.so"),
            &scratch("templates"),
        )
        .unwrap_or_else(|e| panic!("{e} (run cargo build --workspace first)"))
    })
}

fn h100_node(trouble: Arc<Trouble>) -> (MemGpus, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let g = MemGpus::new("n1", &templates()[&Model::H100], 8, 7, trouble, tally.clone());
    (g, tally)
}

/// GPU 0 cut into 3g.40gb + 2g.20gb + 2g.20gb, at the placements NVIDIA's H100 offers (2g.20gb
/// only at 0, 2 and 4: the 3g.40gb takes 4:4).
fn mig_spec() -> GpuNodeSpec {
    serde_json::from_value(json!({"gpus": [{"index": 0, "mode": "MIG", "migInstances": [
        {"profile": "3g.40gb", "placement": {"start": 4, "size": 4}, "tenant": "a"},
        {"profile": "2g.20gb", "placement": {"start": 0, "size": 2}, "tenant": "b"},
        {"profile": "2g.20gb", "placement": {"start": 2, "size": 2}, "tenant": "b"}]}]}))
    .expect("spec")
}

fn gpu0(s: &GpuNodeStatus) -> &gpu_tenancy::api::GpuStatus {
    s.gpus.iter().find(|g| g.index == 0).expect("GPU 0 reported")
}

#[test]
fn models_come_from_the_simulators_discovery() {
    // Profile IDs as NVIDIA's `nvidia-smi mig -lgip` prints them for the H100 80GB (docs/nvidia.md#mig-geometry).
    let h100 = &templates()[&Model::H100].gpu;
    let id = |name: &str| h100.profiles.iter().find(|p| p.name == name).map(|p| p.id);
    assert_eq!(
        (id("1g.10gb"), id("2g.20gb"), id("3g.40gb"), id("7g.80gb")),
        (Some(19), Some(14), Some(9), Some(0))
    );
    let one_g = h100.profiles.iter().find(|p| p.name == "1g.10gb").expect("1g.10gb");
    assert_eq!(one_g.placements.len(), 7);
    assert_eq!(templates()[&Model::A100].gpu.pci_device_id, "0x20B010DE");
    assert!(templates()[&Model::H200].gpu.memory_mib > 140_000);
}

#[test]
fn the_agents_apply_converges_on_memory_gpus_and_a_second_apply_mutates_nothing() {
    let (gpus, tally) = h100_node(Arc::new(Trouble::default()));
    let spec = mig_spec();
    let first = apply(&gpus, &spec, None, &ApplyOptions::default()).expect("apply");
    let g = gpu0(&first.status);
    assert_eq!(g.applied, Some(true), "{g:?}");
    let mut got: Vec<(String, u32)> = g
        .instances
        .iter()
        .map(|i| (i.profile.clone(), i.placement.start))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![("2g.20gb".into(), 0), ("2g.20gb".into(), 2), ("3g.40gb".into(), 4)]
    );
    // MIG mode on, three instances; and the new instances were scrubbed before being reported.
    assert_eq!(tally.mutations.load(Ordering::Relaxed), 4);
    assert!(tally.scrubs.load(Ordering::Relaxed) >= 3);
    let mutations = tally.mutations.load(Ordering::Relaxed);
    let second = apply(&gpus, &spec, Some(&first.status), &ApplyOptions::default()).expect("apply");
    assert_eq!(
        tally.mutations.load(Ordering::Relaxed),
        mutations,
        "a second apply mutates nothing"
    );
    assert_eq!(second.executed, 0);
}

#[test]
fn a_busy_gpu_waits_for_its_process_then_changes() {
    let (gpus, tally) = h100_node(Arc::new(Trouble::default()));
    gpus.start_process(0, Duration::from_millis(300)).expect("GPU 0");
    let busy = apply(&gpus, &mig_spec(), None, &ApplyOptions::default()).expect("apply");
    let g = gpu0(&busy.status);
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("Busy")),
        "{g:?}"
    );
    assert_eq!(g.processes.len(), 1);
    assert_eq!(
        tally.mutations.load(Ordering::Relaxed),
        0,
        "nothing changed under the process"
    );
    std::thread::sleep(Duration::from_millis(400));
    let done = apply(&gpus, &mig_spec(), Some(&busy.status), &ApplyOptions::default()).expect("apply");
    let g = gpu0(&done.status);
    assert_eq!(g.applied, Some(true), "{g:?}");
    assert!(g.processes.is_empty());
}

#[test]
fn an_injected_nvml_failure_is_reported_and_the_next_apply_retries() {
    let trouble = Arc::new(Trouble::default());
    trouble.fail_ppm.store(1_000_000, Ordering::Relaxed);
    let (gpus, tally) = h100_node(trouble.clone());
    let failed = apply(&gpus, &mig_spec(), None, &ApplyOptions::default()).expect("apply");
    let g = gpu0(&failed.status);
    assert_eq!(
        (g.applied, g.reason.map(|r| r.as_str())),
        (Some(false), Some("Failed")),
        "{g:?}"
    );
    assert!(g.message.as_deref().unwrap_or("").contains("injected"), "{g:?}");
    assert!(tally.injected_failures.load(Ordering::Relaxed) >= 1);
    trouble.fail_ppm.store(0, Ordering::Relaxed);
    let ok = apply(&gpus, &mig_spec(), Some(&failed.status), &ApplyOptions::default()).expect("apply");
    assert_eq!(gpu0(&ok.status).applied, Some(true));
}

#[test]
fn the_backend_refuses_what_nvml_refuses() {
    use gpu_tenancy::api::Placement;
    use gpu_tenancy::gpu::actions::Action;
    let (gpus, _) = h100_node(Arc::new(Trouble::default()));
    let create = |start, size, profile_id: u32, profile: &str| Action::CreateInstance {
        gpu: 1,
        profile_id,
        profile: profile.into(),
        placement: Placement { start, size },
    };
    assert!(gpus.execute(&create(0, 4, 9, "3g.40gb")).is_err(), "MIG mode is off");
    gpus.execute(&Action::SetMigMode { gpu: 1, enable: true })
        .expect("MIG on");
    assert!(
        gpus.execute(&create(2, 4, 9, "3g.40gb")).is_err(),
        "3g.40gb is not offered at 2:4"
    );
    gpus.execute(&create(0, 4, 9, "3g.40gb")).expect("3g.40gb at 0:4");
    assert!(gpus.execute(&create(2, 2, 14, "2g.20gb")).is_err(), "overlaps 0:4");
    assert!(
        gpus.execute(&Action::SetMigMode { gpu: 1, enable: false }).is_err(),
        "instances exist"
    );
    gpus.start_process(1, Duration::from_secs(60));
    let s = gpus.discover().expect("discover");
    let gi = s.gpus[1].instances[0].gpu_instance_id;
    let destroy = Action::DestroyGpuInstance {
        gpu: 1,
        gpu_instance_id: gi,
        profile: "3g.40gb".into(),
        placement: Placement { start: 0, size: 4 },
    };
    assert!(gpus.execute(&destroy).is_err(), "a process runs in it");
}

#[test]
fn the_generated_fleet_plans_without_problems() {
    let dir = scratch("generated");
    let nodes = 100;
    crate::write_generated(nodes, generate::tenant_count(nodes), 1, &dir).expect("write");
    let out = crate::plan_command(&target_debug().join("gpu-tenancy"), &dir)
        .output()
        .expect("gpu-tenancy plan runs");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan prints JSON");
    assert_eq!(plan["problems"], json!([]), "{}", String::from_utf8_lossy(&out.stderr));
    // Each plan selects its pool: the planner's count against the generator's own split.
    for p in plan["plans"].as_array().expect("plans") {
        let name = p["metadata"]["name"].as_str().unwrap_or("");
        let expected = (0..nodes).filter(|i| generate::node(*i).pool.name() == name).count();
        assert_eq!(p["status"]["nodes"]["selected"], json!(expected), "{name}");
    }
    assert_eq!(
        (0..nodes).filter(|i| generate::node(*i).pool == Pool::Rollout).count(),
        10
    );
    // Several hundred tenants for a thousand nodes, each granted something.
    assert_eq!(generate::tenant_count(1000), 333);
    let tenants = plan["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), generate::tenant_count(nodes));
    let granted = tenants
        .iter()
        .filter(|t| t["status"]["grants"].as_array().is_some_and(|g| !g.is_empty()))
        .count();
    assert!(
        granted * 10 >= tenants.len() * 9,
        "{granted} of {} tenants granted",
        tenants.len()
    );
}

/// The bench's count of other tenants' moved units: shares count one by one, a grant that only
/// grows or shrinks moves nothing, a share given up here and taken there moves one.
#[test]
fn moved_units_count_what_changed_place() {
    use crate::cluster::moved_units;
    let g = |gpu: u32, count: u32| json!({"node": "n1", "gpu": gpu, "mode": "MPS", "count": count});
    let mig = |placement: &str| json!({"node": "n1", "gpu": 0, "mode": "MIG", "profile": "1g.10gb", "placement": placement, "count": 1});
    let before = json!([g(0, 2), g(1, 2), mig("0:1")]);
    assert_eq!(moved_units(Some(&before), Some(&before)), 0);
    assert_eq!(
        moved_units(Some(&before), Some(&json!([g(0, 3), g(1, 2), mig("0:1")]))),
        0,
        "grew"
    );
    assert_eq!(
        moved_units(Some(&before), Some(&json!([g(0, 2), mig("0:1")]))),
        0,
        "shrank"
    );
    assert_eq!(
        moved_units(Some(&before), Some(&json!([g(0, 3), g(1, 1), mig("0:1")]))),
        1
    );
    assert_eq!(moved_units(Some(&before), Some(&json!([g(0, 4), mig("1:1")]))), 3);
    assert_eq!(moved_units(None, Some(&before)), 0, "a new tenant");
}

#[test]
fn api_paths_are_counted_by_resource() {
    use crate::fleet::resource_of;
    assert_eq!(
        resource_of("/apis/gputenancy.io/v1alpha1/gpunodes/n1/status"),
        "gpunodes/status"
    );
    assert_eq!(resource_of("/api/v1/nodes/n1"), "nodes");
    assert_eq!(resource_of("/api/v1/namespaces/ns/pods/p/eviction"), "pods/eviction");
    assert_eq!(resource_of("/api/v1/namespaces/ns/pods"), "pods");
}

#[test]
fn controller_metrics_are_read() {
    let text = "# TYPE x counter\n\
        gpu_tenancy_controller_objects_written_total{kind=\"GpuNode\",action=\"apply\"} 5\n\
        gpu_tenancy_controller_pass_duration_seconds_sum 1.5\n\
        gpu_tenancy_controller_pass_duration_seconds_count 3\n\
        gpu_tenancy_controller_pass_duration_seconds_bucket{le=\"0.005\"} 1\n\
        gpu_tenancy_controller_pass_duration_seconds_bucket{le=\"1.28\"} 3\n\
        gpu_tenancy_controller_pass_duration_seconds_bucket{le=\"+Inf\"} 3\n";
    let m = crate::probe::parse_metrics(text);
    assert_eq!(m.written.get("GpuNode/apply"), Some(&5.0));
    let (n, mean, slowest) = m.passes_since(&Default::default());
    assert_eq!((n, mean, slowest), (3, 0.5, 1.28));
}

#[test]
fn the_planner_time_is_read_from_the_controllers_log() {
    let log = "{\"level\":\"INFO\",\"message\":\"wrote\",\"write\":\"apply GpuNode a\"}\n\
        {\"level\":\"INFO\",\"message\":\"pass done\",\"writes\":587,\"plan_ms\":66}\n\
        not json\n\
        {\"level\":\"INFO\",\"message\":\"pass done\",\"writes\":0,\"plan_ms\":150,\"desired_ms\":40,\"desired_cpu_ms\":31,\"full_ms\":120}\n";
    let p = crate::probe::parse_pass_lines(log);
    assert_eq!(
        p.iter()
            .map(|p| (p.writes, p.plan_ms, p.desired_ms, p.desired_cpu_ms, p.full_ms))
            .collect::<Vec<_>>(),
        vec![(587, 66, None, None, None), (0, 150, Some(40), Some(31), Some(120))]
    );
}
