//! DRA mode, node side, on the real API server: a real `gpu-tenancy agent run --mode
//! dra` on simulated GPUs, its sockets in a temporary directory, and the test playing the kubelet
//! (GetInfo, then Prepare and Unprepare as the kubelet calls them) for ResourceClaims whose
//! allocation the test writes (the scheduler comes with the cluster-side issue). This binary owns
//! its control plane (e2e/run.sh gives it one): no admission policy of the controller runs here.
//!
//! The test plays the kubelet here because what it checks are the plugin's answers to calls a
//! real kubelet would not make: a claim's UID that is not the API server's, a claim of another
//! tenant's device, a Prepare dropped at its deadline and sent again, a checkpoint forged between
//! two calls. The real kubelet's calls are in the cluster suite (`tests/dra_cluster/real_kubelet*`).
//!
//! The oracle is the simulator: it marks memory with the tenant whose workload wrote it (`sim-ctl
//! dirty`) and clears it only when the agent scrubs (`scrubs` in its state); a device handed over
//! with another claim's data in it would show that data.

mod memory_caps;

use gpu_tenancy::agent::dra::devices::DRIVER;
use gpu_tenancy::api::GpuNode;
use gpu_tenancy_e2e::kubelet::{self, Prepared};
use gpu_tenancy_e2e::procs::SimAgent;
use gpu_tenancy_e2e::{Cleanup, client, create_namespace, ensure_crds, ensure_operator_namespaces, repo_root};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod evidence;

const NODE: &str = "dra-n1";

fn mig(start: u32, tenant: &str) -> Value {
    json!({"profile": "3g.40gb", "placement": {"start": start, "size": 4}, "tenant": tenant})
}

/// Writes the GpuNode spec as the controller would: GPU 0's instances `gpu0` under
/// `scrubMemory: OnTenantChange` (the default when `None`), GPU 1 one instance for dra-c under
/// `Always`.
async fn write_gpus(client: &Client, gpu0: Value, scrub: Option<&str>) {
    let mut first = json!({"index": 0, "mode": "MIG", "migInstances": gpu0});
    if let Some(s) = scrub {
        first["scrub"] = json!(s);
    }
    let spec = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": NODE},
        "spec": {"plan": "dra", "deviceAccess": "DRA", "gpus": [first,
            {"index": 1, "mode": "MIG", "migInstances": [mig(0, "dra-c")], "scrub": "Always"}]}});
    Api::<GpuNode>::all(client.clone())
        .patch(
            NODE,
            &PatchParams::apply("gpu-tenancy-controller").force(),
            &Patch::Apply(spec),
        )
        .await
        .expect("writing the GpuNode spec");
}

/// GPU 0 cut in two for `gpu0`'s tenants.
async fn write_spec(client: &Client, gpu0: [&str; 2]) {
    write_gpus(
        client,
        json!([mig(0, gpu0[0]), mig(4, gpu0[1])]),
        Some("OnTenantChange"),
    )
    .await;
}

/// GPU 0 as one 7g instance of `tenant`.
fn whole(tenant: &str) -> Value {
    json!([{"profile": "7g.80gb", "placement": {"start": 0, "size": 8}, "tenant": tenant}])
}

/// Waits until the agent reports the current spec applied (Ready for its generation).
async fn applied(client: &Client, what: &str) {
    let api: Api<GpuNode> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = api.get(NODE).await.unwrap();
        let st = n.status.clone().unwrap_or_default();
        let ready = st
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True" && c.observed_generation == n.metadata.generation);
        if ready && st.observed_generation == n.metadata.generation {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the agent did not apply the spec: {st:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn slices(client: &Client) -> Vec<ResourceSlice> {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .unwrap()
        .items
}

/// Waits until the slices say `want(devices)`.
async fn slices_say(client: &Client, what: &str, want: impl Fn(&[Value]) -> bool) -> Vec<ResourceSlice> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = slices(client).await;
        let devices: Vec<Value> = s
            .iter()
            .flat_map(|x| x.spec.devices.clone().unwrap_or_default())
            .map(|d| serde_json::to_value(d).unwrap())
            .collect();
        if want(&devices) {
            return s;
        }
        if Instant::now() > deadline {
            let n = Api::<GpuNode>::all(client.clone()).get(NODE).await.unwrap();
            let st = n.status.unwrap_or_default();
            let gpus: Vec<String> = st
                .gpus
                .iter()
                .map(|g| format!("GPU {} applied {:?} {:?} {:?}", g.index, g.applied, g.reason, g.message))
                .collect();
            panic!(
                "{what}: the slices say {devices:#?}\nthe GpuNode: generation {:?}, observed {:?}, {gpus:#?}",
                n.metadata.generation, st.observed_generation
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tenant_of(d: &Value) -> &str {
    d["attributes"]["tenant"]["string"].as_str().unwrap_or("")
}

/// A ResourceClaim in `ns` allocated `device` of this node's pool, as the scheduler would write it.
async fn claim(client: &Client, ns: &str, name: &str, device: &str) -> kubelet::Claim {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    let c: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}))
    .unwrap();
    let c = api
        .create(&PostParams::default(), &c)
        .await
        .expect("creating the claim");
    let status = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}});
    api.patch_status(
        name,
        &PatchParams::apply("e2e-scheduler").force(),
        &Patch::Apply(status),
    )
    .await
    .expect("writing the claim's allocation");
    kubelet::claim(ns, name, &c.uid().unwrap())
}

/// The data still in GPU `gpu`'s memory slices from `start` for 4, by whose workload wrote it.
fn dirt(agent: &SimAgent, gpu: usize, start: usize) -> Vec<String> {
    let st = agent.sim_state();
    st["gpus"][gpu]["dirty"].as_array().unwrap()[start..start + 4]
        .iter()
        .filter_map(|d| d.as_str().map(String::from))
        .collect()
}

fn scrubs(agent: &SimAgent) -> usize {
    agent.sim_state()["scrubs"].as_array().map_or(0, |s| s.len())
}

/// Checks every CDI device ID with the CDI project's own validation (e2e/cdi-check).
fn cdi_valid(dir: &std::path::Path, ids: &[String]) {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    let mut cmd = std::process::Command::new("go");
    // The lowest cdiVersion that expresses the spec: containerd 1.7 to 2.2.0 refuse 1.1.0.
    cmd.current_dir(repo_root().join("e2e/cdi-check"))
        .args(["run", ".", "-lowest-version"]);
    for id in ids.iter().filter(|i| i.starts_with("gputenancy.io/")) {
        cmd.args(["-require-device", id]);
    }
    cmd.args(&files);
    let out = cmd.output().expect("go runs e2e/cdi-check");
    assert!(
        out.status.success(),
        "the CDI specs are not valid to the CDI library: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ok(p: Result<Prepared, String>, what: &str) -> Vec<(String, Vec<String>)> {
    match p {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => panic!("{what}: refused: {e}"),
        Err(e) => panic!("{what}: the plugin did not answer: {e}"),
    }
}

#[tokio::test]
async fn the_dra_plugin_binds_devices_to_tenants_and_scrubs_every_change_of_hands() {
    let cleanup = Cleanup::new();
    let client = client().await;
    ensure_crds(&client).await;
    ensure_operator_namespaces(&client).await;
    for (t, tier) in [("dra-a", "x"), ("dra-b", "x"), ("dra-c", "y")] {
        let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": t},
            "spec": {"tier": tier, "namespaces": [t]}});
        gpu_tenancy_e2e::api(&client, "GpuTenant")
            .patch(t, &PatchParams::apply("e2e").force(), &Patch::Apply(body))
            .await
            .unwrap();
        cleanup.add("GpuTenant", t);
        create_namespace(&client, &cleanup, t, &[]).await;
    }
    let mut agent = SimAgent::start_dra(&client, &cleanup, NODE, "dra", 2).await;
    let dir = agent.dir().to_path_buf();
    let reg = dir.join(format!("plugins_registry/{DRIVER}-reg.sock"));
    let dra = dir.join(format!("plugins/{DRIVER}/dra.sock"));
    let cdi = dir.join("cdi");

    // Registration by the kubelet's own code (its plugin watcher's dial, GetInfo, validation and
    // NotifyRegistrationStatus, built into e2e/bin/controlplane): grpc-go dials the bare socket
    // path and sends it, percent-encoded, as the HTTP/2 :authority.
    let out = std::process::Command::new(repo_root().join("e2e/bin/controlplane"))
        .args(["register-plugin", "--socket"])
        .arg(&reg)
        .output()
        .expect("running e2e/bin/controlplane register-plugin");
    assert!(
        out.status.success(),
        "the kubelet's registration failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "registered {DRIVER} {} v1.DRAPlugin,v1.DRAResourceHealth,v1alpha1.DRAResourceHealth",
            dra.display()
        )
    );
    // And as the suite's own client sees it.
    let info = kubelet::register(&reg).await;
    assert_eq!(
        (
            info.r#type.as_str(),
            info.name.as_str(),
            info.supported_versions.clone()
        ),
        (
            "DRAPlugin",
            DRIVER,
            ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
                .map(String::from)
                .to_vec()
        )
    );
    assert_eq!(PathBuf::from(&info.endpoint), dra);

    // The pool follows the spec: three instances, each with its tenant, untainted once applied.
    write_spec(&client, ["dra-a", "dra-b"]).await;
    applied(&client, "the first spec").await;
    let s = slices_say(&client, "three devices, untainted", |d| {
        d.len() == 3 && d.iter().all(|x| x.get("taints").is_none())
    })
    .await;
    // Owned by their Node: deleted with it.
    let node_uid = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(NODE)
        .await
        .unwrap()
        .uid();
    for slice in &s {
        let owners: Vec<(String, String, Option<String>)> = slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| (o.kind.clone(), o.name.clone(), Some(o.uid.clone())))
            .collect();
        assert_eq!(owners, [("Node".to_string(), NODE.to_string(), node_uid.clone())]);
    }
    let tenants: Vec<(String, String)> = s
        .iter()
        .flat_map(|x| x.spec.devices.clone().unwrap_or_default())
        .map(|d| {
            let v = serde_json::to_value(&d).unwrap();
            (d.name.clone(), tenant_of(&v).to_string())
        })
        .collect();
    assert_eq!(
        tenants,
        [
            ("gpu-0-mig-0-4".to_string(), "dra-a".to_string()),
            ("gpu-0-mig-4-4".to_string(), "dra-b".to_string()),
            ("gpu-1-mig-0-4".to_string(), "dra-c".to_string())
        ]
    );
    // Nothing changes: nothing is written (the agent reads its GPUs every second).
    let rv: Vec<String> = s.iter().map(|x| x.resource_version().unwrap()).collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let again: Vec<String> = slices(&client)
        .await
        .iter()
        .map(|x| x.resource_version().unwrap())
        .collect();
    assert_eq!(rv, again, "an idle agent rewrote its ResourceSlices");
    // The kubelet deletes its node's slices when it starts (and a driver's 30 s after the
    // plugin's last connection drops): the agent writes them back.
    let all_slices: Api<ResourceSlice> = Api::all(client.clone());
    for s in slices(&client).await {
        all_slices.delete(&s.name_any(), &Default::default()).await.unwrap();
    }
    let t0 = Instant::now();
    slices_say(&client, "the wiped slices written back", |d| {
        d.len() == 3 && d.iter().all(|x| x.get("taints").is_none())
    })
    .await;
    eprintln!("MEASURE wiped slices written back in {:?}", t0.elapsed());

    // (1) A claim of dra-a allocated dra-b's instance is refused; nothing is prepared.
    let stolen = claim(&client, "dra-a", "steal", "gpu-0-mig-4-4").await;
    match kubelet::prepare(&dra, &stolen).await.expect("the plugin answers") {
        Err(e) => assert!(e.contains("is GpuTenant dra-b's, not GpuTenant dra-a's"), "{e}"),
        Ok(d) => panic!("dra-a's claim got dra-b's device: {d:?}"),
    }

    // (2) dra-a's claim on its instance: scrubbed first (the agent knows no claim before it), a
    // CDI spec the CDI library accepts, idempotent.
    let a1 = claim(&client, "dra-a", "a1", "gpu-0-mig-0-4").await;
    let before = scrubs(&agent);
    let t0 = Instant::now();
    let got = ok(kubelet::prepare(&dra, &a1).await, "dra-a's claim");
    let first_prepare = t0.elapsed();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "gpu-0-mig-0-4");
    assert!(
        scrubs(&agent) > before,
        "a device with an unknown past was handed over without a scrub"
    );
    cdi_valid(&cdi, &got[0].1);
    // Its evidence: scrubbed, by whom it was used before the agent cannot know.
    let first = evidence::Want {
        scrub: "Scrubbed",
        previous: "Unknown",
        verified: true,
    };
    evidence::shows(&client, "dra-a", "a1", "gpu-0-mig-0-4", first).await;
    assert_eq!(
        ok(kubelet::prepare(&dra, &a1).await, "dra-a's claim again"),
        got,
        "Prepare is not idempotent"
    );
    // dra-a's workload writes the instance's memory; the claim ends.
    agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", "dra-a"]);
    kubelet::unprepare(&dra, &a1).await.unwrap().expect("unprepare");
    kubelet::unprepare(&dra, &a1)
        .await
        .unwrap()
        .expect("unprepare is idempotent");

    // (3) The instance changes hands: the spec gives it to dra-b. dra-b's Prepare returns only
    // once dra-a's data is gone.
    write_spec(&client, ["dra-b", "dra-a"]).await;
    applied(&client, "the hand-over").await;
    slices_say(&client, "the instance is dra-b's", |d| {
        d.iter()
            .any(|x| x["name"] == "gpu-0-mig-0-4" && tenant_of(x) == "dra-b" && x.get("taints").is_none())
    })
    .await;
    // The GPU layer scrubbed at the hand-over; dra-a writes again as if its last job still ran,
    // so only a scrub by Prepare can clear it.
    agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", "dra-a"]);
    let b1 = claim(&client, "dra-b", "b1", "gpu-0-mig-0-4").await;
    let t0 = Instant::now();
    ok(kubelet::prepare(&dra, &b1).await, "dra-b's claim after dra-a's");
    let handover_prepare = t0.elapsed();
    assert_eq!(dirt(&agent, 0, 0), Vec::<String>::new(), "dra-b got dra-a's data");
    // dra-b reads on its claim that another tenant held the device and that it was scrubbed, with
    // how many bytes were read back as zero; not which tenant. It cannot write that itself.
    let handed = evidence::Want {
        scrub: "Scrubbed",
        previous: "OtherTenant",
        verified: true,
    };
    evidence::shows(&client, "dra-b", "b1", "gpu-0-mig-0-4", handed).await;
    evidence::the_tenant_reads_and_cannot_forge("dra-b", "b1", "gpu-0-mig-0-4", &["dra-a"]).await;
    kubelet::unprepare(&dra, &b1).await.unwrap().unwrap();
    // dra-b's next claim on it: its own tenant's claim before, no scrub (OnTenantChange).
    let b1_again = claim(&client, "dra-b", "b1-again", "gpu-0-mig-0-4").await;
    ok(kubelet::prepare(&dra, &b1_again).await, "dra-b's second claim");
    let own = evidence::Want {
        scrub: "NotNeeded",
        previous: "SameTenant",
        verified: false,
    };
    evidence::shows(&client, "dra-b", "b1-again", "gpu-0-mig-0-4", own).await;
    kubelet::unprepare(&dra, &b1_again).await.unwrap().unwrap();

    // (4) scrubMemory Always: between two claims of one tenant, the memory is cleared.
    let c1 = claim(&client, "dra-c", "c1", "gpu-1-mig-0-4").await;
    ok(kubelet::prepare(&dra, &c1).await, "dra-c's first claim");
    agent.sim_ctl(&["dirty", "--gpu", "1", "--start", "0", "--tenant", "claim-c1"]);
    kubelet::unprepare(&dra, &c1).await.unwrap().unwrap();
    let c2 = claim(&client, "dra-c", "c2", "gpu-1-mig-0-4").await;
    let t0 = Instant::now();
    ok(kubelet::prepare(&dra, &c2).await, "dra-c's second claim");
    let always_prepare = t0.elapsed();
    assert_eq!(
        dirt(&agent, 1, 0),
        Vec::<String>::new(),
        "scrubMemory Always: claim c2 got c1's data"
    );
    let always = evidence::Want {
        scrub: "Scrubbed",
        previous: "SameTenant",
        verified: true,
    };
    evidence::shows(&client, "dra-c", "c2", "gpu-1-mig-0-4", always).await;
    // (4b) Memory that does not clear: a byte no memset clears, in the middle of the scrub's
    // fourth allocation (sim-ctl plant), fails the verification of the scrub after c2 and then of
    // c3's Prepare, which is refused, naming the byte; once it clears, the claim is prepared.
    let stale = (3 * 256 * 1024 * 1024 + 128 * 1024 * 1024 + 12).to_string();
    agent.sim_ctl(&[
        "plant", "--gpu", "1", "--start", "0", "--offset", &stale, "--value", "0x5A",
    ]);
    kubelet::unprepare(&dra, &c2).await.unwrap().unwrap();
    let c3 = claim(&client, "dra-c", "c3", "gpu-1-mig-0-4").await;
    match kubelet::prepare(&dra, &c3).await.expect("the plugin answers") {
        Err(e) => assert!(
            e.contains("byte 134217740 of allocation 3 reads 0x5a") && e.contains("not handed over"),
            "{e}"
        ),
        Ok(d) => panic!("a device whose memory did not clear was prepared: {d:?}"),
    }
    agent.sim_ctl(&["unplant"]);
    ok(
        kubelet::prepare(&dra, &c3).await,
        "dra-c's claim once its memory clears",
    );
    kubelet::unprepare(&dra, &c3).await.unwrap().unwrap();

    // (5) Killed at every step of a change of hands (dra-a's claim released, the instance given to
    // dra-b, dra-b's claim prepared), then restarted: never a dirty device. Before dra-b's claim,
    // dra-a's data is written again, as if the GPU layer's own scrub at the hand-over had not run:
    // only Prepare's can clear it.
    let steps = [
        "unprepare-released",
        "unprepare-recorded",
        "prepare-scrubbed",
        "prepare-cdi-written",
        "prepare-recorded",
    ];
    for (i, step) in steps.iter().enumerate() {
        write_spec(&client, ["dra-a", "dra-b"]).await;
        applied(&client, "the instance back to dra-a").await;
        slices_say(&client, "the instance is dra-a's", |d| {
            d.iter()
                .any(|x| x["name"] == "gpu-0-mig-0-4" && tenant_of(x) == "dra-a" && x.get("taints").is_none())
        })
        .await;
        let pa = claim(&client, "dra-a", &format!("k{i}-a"), "gpu-0-mig-0-4").await;
        ok(kubelet::prepare(&dra, &pa).await, "dra-a's claim");
        let data = format!("dra-a-job-{i}");
        agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", &data]);
        let kill_at = |agent: &mut SimAgent| {
            agent.env = vec![("GPU_TENANCY_DRA_ABORT_AT".into(), step.to_string())];
            agent.restart();
        };
        if step.starts_with("unprepare") {
            kill_at(&mut agent);
            kubelet::register(&reg).await;
            let r = kubelet::unprepare(&dra, &pa).await;
            assert!(
                r.is_err(),
                "{step}: the agent was to abort in Unprepare; it answered {r:?}"
            );
            assert!(
                agent.exited(Duration::from_secs(10)).await.is_some(),
                "{step}: the agent did not abort"
            );
            agent.env.clear();
            agent.restart();
            kubelet::register(&reg).await;
        }
        // The kubelet calls Unprepare (again, after a kill) until it succeeds.
        kubelet::unprepare(&dra, &pa).await.unwrap().expect("unprepare");
        write_spec(&client, ["dra-b", "dra-a"]).await;
        applied(&client, "the instance to dra-b").await;
        slices_say(&client, "the instance is dra-b's", |d| {
            d.iter()
                .any(|x| x["name"] == "gpu-0-mig-0-4" && tenant_of(x) == "dra-b" && x.get("taints").is_none())
        })
        .await;
        agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", &data]);
        let pb = claim(&client, "dra-b", &format!("k{i}-b"), "gpu-0-mig-0-4").await;
        if step.starts_with("prepare") {
            kill_at(&mut agent);
            kubelet::register(&reg).await;
            let r = kubelet::prepare(&dra, &pb).await;
            assert!(
                r.is_err(),
                "{step}: the agent was to abort in Prepare; it answered {r:?}"
            );
            assert!(
                agent.exited(Duration::from_secs(10)).await.is_some(),
                "{step}: the agent did not abort"
            );
            agent.env.clear();
            agent.restart();
            kubelet::register(&reg).await;
        }
        let first = ok(
            kubelet::prepare(&dra, &pb).await,
            &format!("{step}: dra-b's claim after the restart"),
        );
        assert_eq!(
            dirt(&agent, 0, 0),
            Vec::<String>::new(),
            "{step}: dra-b's claim got dra-a's data after a kill"
        );
        // And its evidence says so, whichever step the agent was killed after.
        let after_kill = evidence::Want {
            scrub: "Scrubbed",
            previous: "OtherTenant",
            verified: true,
        };
        evidence::shows(&client, "dra-b", &format!("k{i}-b"), "gpu-0-mig-0-4", after_kill).await;
        assert_eq!(
            ok(kubelet::prepare(&dra, &pb).await, "again"),
            first,
            "{step}: Prepare not idempotent after a restart"
        );
        kubelet::unprepare(&dra, &pb).await.unwrap().unwrap();
        eprintln!("MEASURE killed after {step}: after the restart dra-b's claim was clean");
    }

    // (6) A busy device: a process runs on dra-b's instance while the spec changes that GPU; the
    // slice taints both instances of the GPU and Prepare refuses.
    agent.sim_ctl(&[
        "attach", "--gpu", "0", "--start", "0", "--pid", "4242", "--tenant", "dra-b",
    ]);
    write_gpus(&client, whole("dra-b"), None).await;
    slices_say(&client, "the busy GPU's device tainted", |d| {
        d.iter()
            .filter(|x| x["name"].as_str().is_some_and(|n| n.starts_with("gpu-0-")))
            .all(|x| x["taints"][0]["key"] == "gputenancy.io/not-ready")
            && d.iter()
                .any(|x| x["name"].as_str().is_some_and(|n| n.starts_with("gpu-0-")))
    })
    .await;
    let b2 = claim(&client, "dra-b", "b2", "gpu-0-mig-0-8").await;
    match kubelet::prepare(&dra, &b2).await.expect("the plugin answers") {
        Err(e) => assert!(e.contains("may not be handed over yet") || e.contains("busy"), "{e}"),
        Ok(d) => panic!("a busy device was prepared: {d:?}"),
    }
    agent.sim_ctl(&["detach", "--pid", "4242"]);
    applied(&client, "the new layout once the process ended").await;

    // (7) The agent of this node may write only its own node's slices of this driver: RBAC and
    // the admission policy of deploy/base, by impersonation of its pod-bound token.
    for f in ["agent-rbac", "agent-node-policy"] {
        let docs = gpu_tenancy_e2e::yaml_docs(&repo_root().join(format!("deploy/base/{f}.yaml")));
        gpu_tenancy_e2e::apply_docs_as_kubectl(&docs, f).await;
    }
    let extra = std::collections::HashMap::from([(
        "authentication.kubernetes.io/node-name".to_string(),
        vec![NODE.to_string()],
    )]);
    let as_agent = gpu_tenancy_e2e::access::impersonating(
        "system:serviceaccount:gpu-tenancy-system:gpu-tenancy-agent",
        &gpu_tenancy_e2e::access::OPERATOR_SA_GROUPS,
        Some(extra),
    )
    .await;
    let slice = |node: &str, driver: &str| -> ResourceSlice {
        serde_json::from_value(json!({"metadata": {"name": format!("{node}-probe")},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []}}))
        .unwrap()
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let agent_slices: Api<ResourceSlice> = Api::all(as_agent);
    let own = gpu_tenancy_e2e::access::eventually(
        "the agent's RBAC and policy in place",
        || {
            let (api, s, dry) = (agent_slices.clone(), slice(NODE, DRIVER), dry.clone());
            async move { gpu_tenancy_e2e::access::outcome(api.create(&dry, &s).await) }
        },
        |r| r.is_ok(),
    )
    .await;
    assert!(own.is_ok(), "{own:?}");
    for (node, driver) in [("another-node", DRIVER), (NODE, "gpu.nvidia.com")] {
        let r = gpu_tenancy_e2e::access::eventually(
            "the agent refused another node's or driver's slice",
            || {
                let (api, s, dry) = (agent_slices.clone(), slice(node, driver), dry.clone());
                async move { gpu_tenancy_e2e::access::outcome(api.create(&dry, &s).await) }
            },
            |r| r.is_err(),
        )
        .await;
        let e = r.unwrap_err();
        assert!(e.contains("rule agent-publishes-its-own-node"), "{node} {driver}: {e}");
    }
    // And in a claim's status only its own driver's entries, of claims on its own node.
    evidence::only_the_claims_agent_writes_its_entry("dra-b", "b1", "gpu-0-mig-0-4").await;
    let _ = &cleanup;

    eprintln!(
        "MEASURE Prepare latency on the simulator: first claim (scrub, unknown past) {first_prepare:?}, \
         after another tenant's claim (scrub) {handover_prepare:?}, under Always after a scrub on Unprepare {always_prepare:?}"
    );

    the_agent_trusts_only_its_own_files(&client, &mut agent, &reg, &dra, &cdi).await;
    a_reboot_prepares_the_claim_again(&client, &mut agent, &reg, &dra, &cdi).await;
    a_scrub_holds_up_no_other_device(&client, &mut agent, &reg, &dra).await;
    a_pod_holds_no_more_than_its_tenants_limit(&client, &dra).await;

    // A clean stop removes both sockets: the kubelet deregisters the plugin rather than keep a
    // dead endpoint registered.
    let status = agent.terminate(Duration::from_secs(20)).await;
    assert!(status.is_some(), "the agent did not stop on SIGTERM");
    for socket in [&reg, &dra] {
        assert!(!socket.exists(), "{} left after a clean stop", socket.display());
    }
}

/// Sets GPU 0 to one 7g instance of `tenant` and waits until it is published untainted.
async fn whole_gpu0_to(client: &Client, tenant: &str) {
    write_gpus(client, whole(tenant), Some("OnTenantChange")).await;
    applied(client, "GPU 0 whole").await;
    slices_say(client, "GPU 0's instance published", |d| {
        d.iter()
            .any(|x| x["name"] == "gpu-0-mig-0-8" && tenant_of(x) == tenant && x.get("taints").is_none())
    })
    .await;
}

/// The checkpoint and the CDI specs decide hand-overs: one changed behind the agent's back is
/// not believed (a forged "clean" record still gets a scrub) or is written again, and Prepare
/// asks the API server about a claim before it answers from its record.
async fn the_agent_trusts_only_its_own_files(
    client: &Client,
    agent: &mut SimAgent,
    reg: &std::path::Path,
    dra: &std::path::Path,
    cdi: &std::path::Path,
) {
    whole_gpu0_to(client, "dra-b").await;
    let f1 = claim(client, "dra-b", "f1", "gpu-0-mig-0-8").await;
    ok(kubelet::prepare(dra, &f1).await, "dra-b's claim on the whole GPU");
    agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", "dra-b-secret"]);
    kubelet::unprepare(dra, &f1).await.unwrap().unwrap();

    // Someone who can write the state directory marks the released instance clean, keeping the
    // file's seal as it was (the key is the agent's alone).
    let state = agent.dir().join("state/dra-checkpoint.json");
    let sealed: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let data = sealed["data"].as_str().unwrap();
    assert!(data.contains("\"released\""), "{data}");
    let mut forged = sealed.clone();
    forged["data"] = Value::String(data.replace("\"released\"", "\"clean\""));
    std::fs::write(&state, serde_json::to_vec_pretty(&forged).unwrap()).unwrap();
    agent.restart();
    kubelet::register(reg).await;
    whole_gpu0_to(client, "dra-a").await;
    assert!(
        agent.dir().join("state/dra-checkpoint.json.untrusted").exists(),
        "the forged checkpoint was not set aside"
    );
    agent.sim_ctl(&["dirty", "--gpu", "0", "--start", "0", "--tenant", "dra-b-secret"]);
    let f2 = claim(client, "dra-a", "f2", "gpu-0-mig-0-8").await;
    let before = scrubs(agent);
    let got = ok(kubelet::prepare(dra, &f2).await, "dra-a's claim after the forgery");
    assert!(scrubs(agent) > before, "a forged clean record skipped the scrub");
    assert_eq!(dirt(agent, 0, 0), Vec::<String>::new(), "dra-a got dra-b's data");

    // The claim's CDI spec is changed to hand the container every GPU: the next Prepare (the
    // kubelet's retry) writes it back before it answers.
    let spec_path = cdi.join(format!("gputenancy.io-gpu_{}.json", f2.uid));
    let written = std::fs::read_to_string(&spec_path).unwrap();
    let tampered = written.replace("NVIDIA_VISIBLE_DEVICES=MIG-", "NVIDIA_VISIBLE_DEVICES=all,MIG-");
    assert_ne!(tampered, written);
    std::fs::write(&spec_path, &tampered).unwrap();
    assert_eq!(ok(kubelet::prepare(dra, &f2).await, "again"), got);
    assert_eq!(
        std::fs::read_to_string(&spec_path).unwrap(),
        written,
        "a CDI spec changed behind the agent was left as it was"
    );

    // The claim is deleted and made again under the same name: Prepare for the old UID is
    // refused, not answered from the record.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "dra-a");
    claims.delete("f2", &Default::default()).await.unwrap();
    let again = claim(client, "dra-a", "f2", "gpu-0-mig-0-8").await;
    assert_ne!(again.uid, f2.uid);
    match kubelet::prepare(dra, &f2).await.expect("the plugin answers") {
        Err(e) => assert!(e.contains("is not the claim asked for"), "{e}"),
        Ok(d) => panic!("a claim deleted and made again was answered from the record: {d:?}"),
    }
    kubelet::unprepare(dra, &f2).await.unwrap().unwrap();
    claims.delete("f2", &Default::default()).await.unwrap();
}

/// A reboot: the GPUs lose their MIG instances (the agent creates them again, with new UUIDs),
/// the runtime's CDI directory (a tmpfs) is empty, and the kubelet, whose checkpoint survived,
/// calls Prepare again for the running pod's claim. Its spec is written again before Prepare
/// answers.
async fn a_reboot_prepares_the_claim_again(
    client: &Client,
    agent: &mut SimAgent,
    reg: &std::path::Path,
    dra: &std::path::Path,
    cdi: &std::path::Path,
) {
    let r1 = claim(client, "dra-a", "r1", "gpu-0-mig-0-8").await;
    let before = ok(kubelet::prepare(dra, &r1).await, "dra-a's claim before the reboot");
    agent.kill();
    agent.sim_ctl(&["reboot"]);
    for f in std::fs::read_dir(cdi).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    agent.restart();
    kubelet::register(reg).await;
    applied(client, "the instance created again after the reboot").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrubs_before = scrubs(agent);
    let after = loop {
        match kubelet::prepare(dra, &r1).await.expect("the plugin answers") {
            Ok(d) => break d,
            // The agent reads its GPUs again after its start: the kubelet retries.
            Err(e) if e.contains("not known yet") || e.contains("may not be handed over yet") => {
                assert!(Instant::now() < deadline, "the claim was never prepared again: {e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => panic!("the claim after the reboot: {e}"),
        }
    };
    // The simulator gives an instance made again its old UUID (its UUIDs follow the GPU and the
    // instance's place), so the record still answers; a new UUID is prepared again, scrubbed
    // first (`prepare::recorded`, unit-tested).
    let same_uuid = after == before;
    assert!(
        same_uuid || scrubs(agent) > scrubs_before,
        "an instance with a new UUID was handed over without a scrub"
    );
    let spec = cdi.join(format!("gputenancy.io-gpu_{}.json", r1.uid));
    assert!(
        spec.exists(),
        "the claim's CDI spec was not written again after the reboot"
    );
    cdi_valid(cdi, &after[0].1);
    kubelet::unprepare(dra, &r1).await.unwrap().unwrap();
}

/// Claims on different devices prepare at once: with each scrub taking 3 s, a claim on GPU 1
/// started while GPU 0's is being scrubbed is ready about when GPU 0's is, not 3 s after it.
async fn a_scrub_holds_up_no_other_device(
    client: &Client,
    agent: &mut SimAgent,
    reg: &std::path::Path,
    dra: &std::path::Path,
) {
    agent.env = vec![("GPU_TENANCY_SIM_SCRUB_MS".into(), "3000".into())];
    agent.restart();
    kubelet::register(reg).await;
    applied(client, "the agent restarted with slow scrubs").await;
    // GPU 0's instance changes hands (a scrub); GPU 1's is under scrubMemory Always (a scrub).
    whole_gpu0_to(client, "dra-b").await;
    let on0 = claim(client, "dra-b", "p0", "gpu-0-mig-0-8").await;
    let on1 = claim(client, "dra-c", "p1", "gpu-1-mig-0-4").await;
    let t0 = Instant::now();
    let first = {
        let (dra, c) = (dra.to_path_buf(), on0.clone());
        tokio::spawn(async move {
            let r = kubelet::prepare(&dra, &c).await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = kubelet::prepare(dra, &on1).await;
    let second_done = Instant::now();
    let (first, first_done) = first.await.unwrap();
    ok(first, "GPU 0's claim");
    ok(second, "GPU 1's claim");
    let gap = second_done.saturating_duration_since(first_done);
    eprintln!(
        "MEASURE two claims on two GPUs, each scrub 3 s: GPU 0's ready after {:?}, GPU 1's {gap:?} after it",
        first_done - t0
    );
    assert!(
        gap < Duration::from_millis(2500),
        "GPU 1's claim waited behind GPU 0's scrub: ready {gap:?} after it"
    );
    for c in [&on0, &on1] {
        kubelet::unprepare(dra, c).await.unwrap().unwrap();
    }
    agent.env.clear();
    agent.restart();
    kubelet::register(reg).await;
    applied(client, "the agent restarted").await;
    whole_gpu0_to(client, "dra-a").await;
}

/// A claim allocated `devices` (all of `pool`, a node's), reserved for `pod` (name, UID) when given,
/// as the scheduler would write it.
async fn claim_in_pool(
    client: &Client,
    ns: &str,
    name: &str,
    pool: &str,
    devices: &[&str],
    pod: Option<&Pod>,
) -> kubelet::Claim {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    let c: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": devices.len()}}]}}}))
    .unwrap();
    let c = api
        .create(&PostParams::default(), &c)
        .await
        .expect("creating the claim");
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": pool, "device": d}))
        .collect();
    let mut status = json!({"allocation": {"devices": {"results": results}}});
    if let Some(p) = pod {
        status["reservedFor"] = json!([{"resource": "pods", "name": p.name_any(), "uid": p.uid().unwrap()}]);
    }
    api.patch_status(
        name,
        &PatchParams::apply("e2e-scheduler").force(),
        &Patch::Apply(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "status": status})),
    )
    .await
    .expect("writing the claim's allocation");
    kubelet::claim(ns, name, &c.uid().unwrap())
}

/// A claim allocated `devices` (all of this node's pool), reserved for `pod` when given.
async fn reserved_claim(client: &Client, ns: &str, name: &str, devices: &[&str], pod: Option<&Pod>) -> kubelet::Claim {
    claim_in_pool(client, ns, name, NODE, devices, pod).await
}

/// A pod of `ns` naming `claims` (entry name, `Some(claim)` or `None` for a template whose claim
/// is `generated`), with `ext` as its extended resource's claim; its status as the
/// ResourceClaim controller and the scheduler write it.
async fn pod_with_claims(
    client: &Client,
    ns: &str,
    name: &str,
    claims: &[(&str, &str, bool)],
    ext: Option<&str>,
) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let entries: Vec<Value> = claims
        .iter()
        .map(|(entry, claim, template)| {
            if *template {
                json!({"name": entry, "resourceClaimTemplateName": "one-gpu"})
            } else {
                json!({"name": entry, "resourceClaimName": claim})
            }
        })
        .collect();
    let mut container = json!({"name": "c", "image": "x"});
    if ext.is_some() {
        container["resources"] = json!({"limits": {"dra-a.gputenancy.io/gpu": 1}});
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"containers": [container], "resourceClaims": entries}}))
    .unwrap();
    api.create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");
    let mut status = json!({"resourceClaimStatuses": claims.iter().filter(|c| c.2)
        .map(|(entry, claim, _)| json!({"name": entry, "resourceClaimName": claim})).collect::<Vec<_>>()});
    if let Some(ext) = ext {
        status["extendedResourceClaimStatus"] = json!({"resourceClaimName": ext, "requestMappings": [
            {"containerName": "c", "resourceName": "dra-a.gputenancy.io/gpu", "requestName": "container-0-request-0"}]});
    }
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .expect("writing the pod's claim statuses")
}

/// `maxGpusPerPod` counts every device a pod holds through its claims: a template named twice,
/// a claim beside an extended resource's. The admission policies cannot see into a pod's
/// claims; Prepare, where every claim of the pod is allocated, counts them.
async fn a_pod_holds_no_more_than_its_tenants_limit(client: &Client, dra: &std::path::Path) {
    let body = json!({"apiVersion": "gputenancy.io/v1alpha1", "kind": "GpuTenant", "metadata": {"name": "dra-a"},
        "spec": {"tier": "x", "namespaces": ["dra-a"], "limits": {"maxGpusPerPod": 1}}});
    gpu_tenancy_e2e::api(client, "GpuTenant")
        .patch("dra-a", &PatchParams::apply("e2e").force(), &Patch::Apply(body))
        .await
        .unwrap();
    let refused = |what: &'static str, says: &'static str| {
        move |p: Result<Prepared, String>| match p.expect("the plugin answers") {
            Err(e) => assert!(e.contains(says), "{what}: {e}"),
            Ok(d) => panic!("{what}: prepared {d:?}"),
        }
    };
    // The agent's tenant store follows the change.
    let unreserved = reserved_claim(client, "dra-a", "lim-none", &["gpu-0-mig-0-8"], None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match kubelet::prepare(dra, &unreserved).await.expect("the plugin answers") {
            Err(e) if e.contains("reserved for no pod") => break,
            other => {
                if let Ok(d) = &other {
                    kubelet::unprepare(dra, &unreserved).await.unwrap().unwrap();
                    let _ = d;
                }
                assert!(Instant::now() < deadline, "the limit never applied: {other:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }

    let twice = pod_with_claims(
        client,
        "dra-a",
        "twice",
        &[("a", "twice-a", true), ("b", "twice-b", true)],
        None,
    )
    .await;
    let a = reserved_claim(client, "dra-a", "twice-a", &["gpu-0-mig-0-8"], Some(&twice)).await;
    reserved_claim(client, "dra-a", "twice-b", &["gpu-0-mig-0-8"], Some(&twice)).await;
    refused("a one-device template named twice", "holds 2 devices")(kubelet::prepare(dra, &a).await);

    let both = pod_with_claims(
        client,
        "dra-a",
        "claim-and-ext",
        &[("a", "both-a", false)],
        Some("both-ext"),
    )
    .await;
    let a = reserved_claim(client, "dra-a", "both-a", &["gpu-0-mig-0-8"], Some(&both)).await;
    reserved_claim(client, "dra-a", "both-ext", &["gpu-0-mig-0-8"], Some(&both)).await;
    refused("a claim beside an extended resource", "holds 2 devices")(kubelet::prepare(dra, &a).await);

    let one = pod_with_claims(client, "dra-a", "one", &[("a", "one-a", false)], None).await;
    let a = reserved_claim(client, "dra-a", "one-a", &["gpu-0-mig-0-8"], Some(&one)).await;
    ok(kubelet::prepare(dra, &a).await, "a pod of one device");
    kubelet::unprepare(dra, &a).await.unwrap().unwrap();
}
