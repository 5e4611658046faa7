//! A generated fleet for scale tests and benchmarks: node pools of H100 (MIG), A100 (MPS),
//! H200 (time-slicing) and H200 (exclusive), and tenants of every tier asking for all of it.
//! Deterministic: a small linear congruential generator, no randomness from outside.

#![allow(dead_code)]

use gpu_tenancy::api::*;
use gpu_tenancy::inventory::{NodeGpu, NodeInventory};
use gpu_tenancy::mig::{ExistingInstance, model_by_name};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// The planner on a fleet, at a fixed time (plans are compared across runs).
pub fn run(f: &Fleet) -> gpu_tenancy::planner::PlanOutput {
    run_with(f, None)
}

/// [`run`], with the memo of earlier runs when one is given (the controller's way).
pub fn run_with(f: &Fleet, memo: Option<&mut gpu_tenancy::planner::PlanMemo>) -> gpu_tenancy::planner::PlanOutput {
    run_at(f, memo, 0)
}

/// The controller's whole desired state of `f` (the plan, admission policies, quotas, node
/// labels), with default settings, the memo's or from nothing.
#[allow(dead_code)] // not every test that includes this file renders the desired state
pub fn desired_with(f: &Fleet, memo: Option<&mut gpu_tenancy::desired::DesiredMemo>) -> gpu_tenancy::desired::Desired {
    desired_at(f, memo, 0)
}

/// [`run_with`] at `second` seconds after the epoch: conditions that turn are stamped with it.
pub fn run_at(
    f: &Fleet,
    memo: Option<&mut gpu_tenancy::planner::PlanMemo>,
    second: i64,
) -> gpu_tenancy::planner::PlanOutput {
    gpu_tenancy::planner::plan_with(&f.input(), &Default::default(), &at(second), memo)
}

/// [`desired_with`] at `second` seconds after the epoch.
#[allow(dead_code)]
pub fn desired_at(
    f: &Fleet,
    memo: Option<&mut gpu_tenancy::desired::DesiredMemo>,
    second: i64,
) -> gpu_tenancy::desired::Desired {
    let settings = gpu_tenancy::desired::Settings::default();
    gpu_tenancy::desired::desired_with(&f.input(), &settings, &at(second), memo)
}

/// A fixed time for condition transitions (the epoch by default), so that runs compare equal.
fn at(second: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::from_second(second).unwrap())
}

impl Fleet {
    /// The fleet as the planner reads it.
    pub fn input(&self) -> gpu_tenancy::planner::PlanInput<'_> {
        gpu_tenancy::planner::PlanInput {
            policies: &self.policies,
            tenants: &self.tenants,
            plans: &self.plans,
            nodes: &self.nodes,
        }
    }
}

#[derive(Clone)]
pub struct Fleet {
    pub policies: Vec<SharingPolicy>,
    pub tenants: Vec<std::sync::Arc<GpuTenant>>,
    pub plans: Vec<GpuPartitionPlan>,
    pub nodes: Vec<NodeInventory>,
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

const POOLS: [(&str, &str); 4] = [
    ("mig", "H100-80GB"),
    ("mps", "A100-40GB"),
    ("ts", "H200"),
    ("excl", "H200"),
];

pub fn fleet(nodes: usize, gpus_per_node: u32, tenants: usize, seed: u64) -> Fleet {
    let mut rng = Lcg(seed);
    let policy: SharingPolicy = serde_saphyr::from_str(include_str!("../../../examples/policy.yaml")).unwrap();
    let group = |devices: &str, mode: Mode| GpuGroup {
        devices: devices.into(),
        mode,
        mig: None,
        mps: None,
        time_slicing: None,
        tenants: vec![],
    };
    let plan = |name: &str, pool: &str, gpus: Vec<GpuGroup>| {
        GpuPartitionPlan::new(
            name,
            GpuPartitionPlanSpec {
                node_selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([("pool".to_string(), pool.to_string())])),
                    match_expressions: None,
                },
                priority: 0,
                gpus,
                rollout: None,
                device_access: Default::default(),
            },
        )
    };
    let half = gpus_per_node / 2;
    let plans = vec![
        plan(
            "mig",
            "mig",
            vec![
                GpuGroup {
                    mig: Some(MigSettings {
                        profiles: vec!["3g.40gb".into(), "2g.20gb".into(), "2g.20gb".into()],
                    }),
                    ..group(&format!("0-{}", half - 1), Mode::Mig)
                },
                GpuGroup {
                    mig: Some(MigSettings {
                        profiles: vec!["1g.10gb".into(); 7],
                    }),
                    ..group(&format!("{half}-{}", gpus_per_node - 1), Mode::Mig)
                },
            ],
        ),
        plan(
            "mps",
            "mps",
            vec![GpuGroup {
                mps: Some(MpsSettings {
                    max_clients: 8,
                    active_thread_percentage: Some(12),
                    // GPU memory / maxClients: what the device plugin pins each client to.
                    pinned_memory_limit: Some("5Gi".into()),
                }),
                ..group("all", Mode::Mps)
            }],
        ),
        plan(
            "ts",
            "ts",
            vec![GpuGroup {
                time_slicing: Some(TimeSlicingSettings { replicas: 4 }),
                ..group("all", Mode::TimeSlicing)
            }],
        ),
        plan("excl", "excl", vec![group("all", Mode::Exclusive)]),
    ];
    let nodes = (0..nodes)
        .map(|i| {
            let (pool, model) = POOLS[i % POOLS.len()];
            let model = model_by_name(model).unwrap();
            let name = format!("node-{i:05}");
            NodeInventory {
                name: name.clone(),
                labels: BTreeMap::from([("pool".to_string(), pool.to_string())]),
                gpus: (0..gpus_per_node)
                    .map(|g| NodeGpu {
                        index: g,
                        model: Some(model),
                        name: model.name().into(),
                        memory_mib: model.memory_mib,
                        numa_node: i32::from(g >= half),
                        uuid: Some(format!("GPU-{name}-{g}")),
                        ..NodeGpu::default()
                    })
                    .collect(),
                reported: true,
                current: None,
                revision: Some(format!("{name}#0")),
            }
        })
        .collect();
    let tenants = (0..tenants)
        .map(|i| std::sync::Arc::new(draw_tenant(&mut rng, i)))
        .collect();
    Fleet {
        policies: vec![policy],
        tenants,
        plans,
        nodes,
    }
}

/// One tenant as [`fleet`] makes them, drawn from `seed`: for adding tenants to a fleet.
pub fn tenant(i: usize, seed: u64) -> GpuTenant {
    draw_tenant(&mut Lcg(seed), i)
}

fn draw_tenant(rng: &mut Lcg, i: usize) -> GpuTenant {
    let tiers = ["external", "internal", "experimental"];
    let tier = tiers[rng.next(3) as usize];
    let mut resources = vec![
        ResourceRequest {
            mode: Mode::Mig,
            profile: Some("3g.40gb".into()),
            count: 1 + rng.next(4) as u32,
        },
        ResourceRequest {
            mode: Mode::Mig,
            profile: Some("1g.10gb".into()),
            count: 1 + rng.next(8) as u32,
        },
        ResourceRequest {
            mode: Mode::Exclusive,
            count: 1 + rng.next(4) as u32,
            profile: None,
        },
    ];
    // One shared mode per tenant: the device plugin counts MPS and time-slicing shares under one
    // resource name, so a tenant may not hold both.
    if tier == "internal" {
        resources.push(ResourceRequest {
            mode: Mode::Mps,
            count: 1 + rng.next(24) as u32,
            profile: None,
        });
    }
    if tier == "experimental" {
        resources.push(ResourceRequest {
            mode: Mode::TimeSlicing,
            count: 1 + rng.next(12) as u32,
            profile: None,
        });
    }
    GpuTenant::new(
        &format!("tenant-{i:04}"),
        GpuTenantSpec {
            tier: tier.into(),
            policy_ref: "default".into(),
            namespaces: vec![format!("ns-{i:04}")],
            priority: rng.next(3) as i32,
            weight: 1 + rng.next(4) as u32,
            resources,
            limits: None,
        },
    )
}

/// A new revision for a node whose inventory changed, as the API server gives a new
/// resourceVersion to an object that changed (the planner's memo trusts an unchanged one).
pub fn revise(n: &mut NodeInventory) {
    let next = n
        .revision
        .as_deref()
        .and_then(|r| r.rsplit_once('#'))
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .map_or(0, |v| v + 1);
    n.revision = Some(format!("{}#{next}", n.name));
}

/// The nodes as they run once `planned` is applied (revised where that changes them): each GPU's mode, whole-GPU tenants with their
/// share counts and MIG
/// instances with their tenants, from its GpuNode spec (what the planner reads back in a cluster).
/// GPUs a spec does not list are taken as empty.
pub fn with_current(nodes: &[NodeInventory], planned: &[GpuNode]) -> Vec<NodeInventory> {
    nodes
        .iter()
        .map(|n| {
            let before = n;
            let mut n = n.clone();
            for g in &mut n.gpus {
                g.mode = None;
                g.tenants.clear();
                g.shares.clear();
                g.instances.clear();
                g.instance_tenants.clear();
            }
            let spec = planned
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(n.name.as_str()));
            for s in spec.iter().flat_map(|p| &p.spec.gpus) {
                let g = &mut n.gpus[s.index as usize];
                g.mode = Some(s.mode);
                if s.mode != Mode::Mig {
                    g.tenants = s.tenants.clone();
                    g.shares = s.shares.iter().map(|x| (x.tenant.clone(), x.count)).collect();
                }
                for i in &s.mig_instances {
                    g.instances.push(ExistingInstance {
                        profile: i.profile.clone(),
                        placement: i.placement,
                        gpu_instance_id: None,
                    });
                    if let Some(t) = &i.tenant {
                        g.instance_tenants.insert(i.placement, t.clone());
                    }
                }
            }
            if n != *before {
                revise(&mut n);
            }
            n
        })
        .collect()
}

/// One change of each kind a controller sees, for the benchmarks (`benches/planner.rs`) and
/// `examples/change_profile.rs`; step `k` undoes step `k - 1` where it can.
pub mod changes {
    use super::Fleet;
    use gpu_tenancy::api::Mode;

    /// A kind of change by name: `tenant`, `node`, `plan` (a priority, nothing moves) and
    /// `replicas` (a quarter of the fleet's GPUs change).
    /// Makes change number `step` (from 1) of its kind.
    pub type Change = fn(&mut Fleet, u32);

    pub const ALL: [(&str, Change); 4] = [
        ("tenant", tenant),
        ("node", node),
        ("plan", plan_priority),
        ("replicas", replicas),
    ];

    /// The first MPS tenant asks for one more share on odd steps, one fewer on even ones.
    pub fn tenant(f: &mut Fleet, step: u32) {
        let (t, r) = f
            .tenants
            .iter()
            .enumerate()
            .find_map(|(t, tenant)| {
                let r = tenant.spec.resources.iter().position(|r| r.mode == Mode::Mps)?;
                Some((t, r))
            })
            .expect("the fleet has MPS tenants");
        let count = &mut std::sync::Arc::make_mut(&mut f.tenants[t]).spec.resources[r].count;
        *count = if step % 2 == 1 { *count + 1 } else { *count - 1 };
    }

    /// One node's inventory: GPU 0's memory as its agent reports it, a new revision; another node
    /// each step.
    pub fn node(f: &mut Fleet, step: u32) {
        let at = step as usize % f.nodes.len();
        let n = &mut f.nodes[at];
        n.gpus[0].memory_mib = if step % 2 == 1 {
            n.gpus[0].memory_mib - 1
        } else {
            n.gpus[0].memory_mib + 1
        };
        super::revise(n);
    }

    /// The exclusive plan's priority: every node of it resolved again, nothing moves.
    pub fn plan_priority(f: &mut Fleet, step: u32) {
        f.plans[3].spec.priority = (step % 2) as i32;
    }

    /// The time-slicing plan's replicas, 4 <-> 5: a quarter of the fleet's GPUs change.
    pub fn replicas(f: &mut Fleet, step: u32) {
        let ts = f.plans[2].spec.gpus[0]
            .time_slicing
            .as_mut()
            .expect("the fleet's third plan is time-slicing");
        ts.replicas = if step % 2 == 1 { 5 } else { 4 };
    }
}
