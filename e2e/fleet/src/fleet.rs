//! Many simulated nodes in one process, each running the agent's own Kubernetes loop
//! (`gpu_tenancy::agent::run_node`) on an in-memory GPU backend.
//!
//! What differs from a thousand real agents is only where a spec change is heard: one shared
//! watch of all GpuNodes wakes the node's task (a thousand watches of one object each would be
//! a thousand connections from one process); every read and write stays per node, as a real
//! agent's does. The agents' requests go through one client whose stack counts them on the wire,
//! by method and resource, so the benchmark's write counts do not come from the loop's own say.

use crate::backend::{MemGpus, ModelTemplate, Tally, Trouble};
use crate::generate::{self, FleetNode, GPUS_PER_NODE, Model};
use crate::rng::Rng;
use futures::StreamExt;
use gpu_tenancy::agent::{self, Options};
use gpu_tenancy::api::{ConditionSet, GpuNode, condition_status};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// API requests counted on the wire, by `METHOD resource[/subresource]`.
#[derive(Debug, Default)]
pub struct Counts(Mutex<BTreeMap<String, u64>>);

impl Counts {
    fn record(&self, method: &http::Method, path: &str) {
        let key = format!("{method} {}", resource_of(path));
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(key).or_default() += 1;
    }

    /// Writes so far (every method but GET), by method and resource.
    pub fn writes(&self) -> BTreeMap<String, u64> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Reads so far (GET: gets, lists and watches).
    pub fn reads(&self) -> u64 {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().filter(|(k, _)| k.starts_with("GET ")).map(|(_, v)| v).sum()
    }
}

/// `pods/eviction` of `/api/v1/namespaces/ns/pods/p/eviction`, `gpunodes/status` of
/// `/apis/gputenancy.io/v1alpha1/gpunodes/n/status`.
pub fn resource_of(path: &str) -> String {
    let seg: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut i = match seg.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return path.to_string(),
    };
    if seg.get(i) == Some(&"namespaces") && seg.len() > i + 2 {
        i += 2;
    }
    match (seg.get(i), seg.get(i + 2)) {
        (Some(r), Some(sub)) => format!("{r}/{sub}"),
        (Some(r), None) => r.to_string(),
        _ => path.to_string(),
    }
}

/// A client for the KUBECONFIG cluster whose requests are counted in `counts`.
pub async fn counting_client(counts: Arc<Counts>) -> Result<Client, String> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("no cluster to talk to (set KUBECONFIG): {e}"))?;
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        counts.record(req.method(), req.uri().path());
        req
    });
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(|e| format!("cannot build a client from KUBECONFIG: {e}"))?
        .with_layer(&layer)
        .build())
}

/// A fleet GpuNode as the shared watch last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    pub ready: bool,
    pub plan: Option<String>,
    /// MIG profiles of GPU 0 in the spec.
    pub spec_profiles: Vec<String>,
}

impl NodeView {
    fn of(n: &GpuNode) -> NodeView {
        let status = n.status.as_ref();
        NodeView {
            generation: n.metadata.generation,
            observed_generation: status.and_then(|s| s.observed_generation),
            ready: status.is_some_and(|s| condition_status(&s.conditions, ConditionSet::READY) == Some(true)),
            plan: n.spec.plan.clone(),
            spec_profiles: n
                .spec
                .gpus
                .iter()
                .find(|g| g.index == 0)
                .map(|g| g.mig_instances.iter().map(|i| i.profile.clone()).collect())
                .unwrap_or_default(),
        }
    }

    /// Its agent has not yet reported the spec it has.
    pub fn behind(&self) -> bool {
        self.generation > self.observed_generation
    }
}

/// The most nodes of one plan seen changing at once since [`Fleet::watch_plan`].
#[derive(Clone, Debug, Default)]
pub struct PlanWatch {
    pub plan: String,
    /// Spec generation ahead of status.observedGeneration.
    pub max_behind: usize,
    /// Behind, or reported but not Ready (e.g. a busy GPU waiting).
    pub max_unavailable: usize,
}

#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub poll: Duration,
    /// Agents of new nodes start spread over this long (a fleet does not boot in one instant).
    pub ramp: Duration,
    pub seed: u64,
    /// Busy processes started per node and hour, and how long each runs.
    pub busy_per_node_hour: u32,
    pub busy_for: Duration,
}

struct Shared {
    views: Mutex<BTreeMap<String, NodeView>>,
    /// Per node, its GpuNode as last seen with a new generation: what wakes its agent.
    wakers: Mutex<HashMap<String, watch::Sender<Option<GpuNode>>>>,
    plan_watch: Mutex<Option<PlanWatch>>,
}

pub struct Fleet {
    agents: Client,
    pub agent_counts: Arc<Counts>,
    harness: Client,
    templates: BTreeMap<Model, ModelTemplate>,
    pub trouble: Arc<Trouble>,
    /// Busy processes are started while this is set.
    pub busy_on: Arc<AtomicBool>,
    pub tally: Arc<Tally>,
    backends: Arc<Mutex<Vec<Arc<MemGpus>>>>,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    opts: FleetOptions,
    rng: Mutex<Rng>,
    size: AtomicU32,
}

impl Fleet {
    /// A fleet with no nodes yet; starts the shared GpuNode watch and the busy-process injector.
    pub async fn new(
        templates: BTreeMap<Model, ModelTemplate>,
        fail_ppm: u32,
        opts: FleetOptions,
    ) -> Result<Fleet, String> {
        let agent_counts = Arc::new(Counts::default());
        let agents = counting_client(agent_counts.clone()).await?;
        let harness = counting_client(Arc::new(Counts::default())).await?;
        let (shutdown, _) = watch::channel(false);
        let fleet = Fleet {
            agents,
            agent_counts,
            harness,
            templates,
            trouble: Arc::new(Trouble {
                fail_ppm: AtomicU32::new(fail_ppm),
            }),
            busy_on: Arc::new(AtomicBool::new(true)),
            tally: Arc::new(Tally::default()),
            backends: Arc::new(Mutex::new(Vec::new())),
            shared: Arc::new(Shared {
                views: Mutex::new(BTreeMap::new()),
                wakers: Mutex::new(HashMap::new()),
                plan_watch: Mutex::new(None),
            }),
            shutdown,
            rng: Mutex::new(Rng::new(opts.seed)),
            opts,
            size: AtomicU32::new(0),
        };
        fleet.spawn_watch();
        fleet.spawn_busy();
        Ok(fleet)
    }

    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed) as usize
    }

    fn spawn_watch(&self) {
        let api: Api<GpuNode> = Api::all(self.harness.clone());
        let shared = self.shared.clone();
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            loop {
                let ev = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    ev = events.next() => ev,
                };
                match ev {
                    Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => shared.seen(&n),
                    Some(Ok(watcher::Event::Delete(n))) => {
                        lock(&shared.views).remove(&n.name_any());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "the fleet's GpuNode watch failed; retrying"),
                    None => return,
                }
            }
        });
    }

    /// Starts busy processes on random GPUs of random nodes at the fleet's rate, while `busy_on`.
    fn spawn_busy(&self) {
        let backends = self.backends.clone();
        let on = self.busy_on.clone();
        let (rate, lasts) = (self.opts.busy_per_node_hour, self.opts.busy_for);
        let mut rng = Rng::new(self.opts.seed ^ 0xB05E);
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            // Fractions of a process carried between ticks, in millionths.
            let mut owed: u64 = 0;
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tick.tick() => {}
                }
                if !on.load(Ordering::Relaxed) || rate == 0 {
                    continue;
                }
                let nodes: Vec<Arc<MemGpus>> = lock(&backends).clone();
                owed += nodes.len() as u64 * u64::from(rate) * 1_000_000 / 3600;
                while owed >= 1_000_000 && !nodes.is_empty() {
                    owed -= 1_000_000;
                    let n = &nodes[rng.below(nodes.len() as u64) as usize];
                    n.start_process(rng.below(u64::from(GPUS_PER_NODE)) as u32, lasts);
                }
            }
        });
    }

    /// Creates the Nodes `from..to` and starts their agents.
    pub async fn grow(&self, from: usize, to: usize) -> Result<(), String> {
        let nodes: Vec<FleetNode> = (from..to).map(generate::node).collect();
        let api: Api<Node> = Api::all(self.harness.clone());
        let created: Vec<Result<(), String>> = futures::stream::iter(nodes.iter())
            .map(|n| {
                let api = api.clone();
                async move {
                    let obj: Node = serde_json::from_value(generate::node_object(n))
                        .map_err(|e| format!("Node {}: {e}", n.name))?;
                    match api.create(&PostParams::default(), &obj).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                        Err(e) => Err(format!("creating Node {}: {e}", n.name)),
                    }
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        created.into_iter().collect::<Result<Vec<()>, String>>()?;
        for n in &nodes {
            self.start_agent(n)?;
        }
        self.size.store(to as u32, Ordering::Relaxed);
        Ok(())
    }

    fn start_agent(&self, n: &FleetNode) -> Result<(), String> {
        let template = self
            .templates
            .get(&n.model)
            .ok_or_else(|| format!("node {}: no template for {:?}", n.name, n.model))?;
        let (seed, delay) = {
            let mut rng = lock(&self.rng);
            let ramp = self.opts.ramp.as_millis() as u64;
            (rng.next_u64(), Duration::from_millis(rng.below(ramp)))
        };
        let gpus = Arc::new(MemGpus::new(
            &n.name,
            template,
            GPUS_PER_NODE,
            seed,
            self.trouble.clone(),
            self.tally.clone(),
        ));
        lock(&self.backends).push(gpus.clone());
        let (tx, rx) = watch::channel(None);
        lock(&self.shared.wakers).insert(n.name.clone(), tx);
        let opts = Options {
            node: n.name.clone(),
            nvml_lib: None,
            cuda_lib: None,
            poll: self.opts.poll,
            // The device plugin's mode, with no plugin or kubelet to read.
            mode: Default::default(),
            metrics: None,
            attribution: None,
        };
        let client = self.agents.clone();
        let mut stop = self.shutdown.subscribe();
        let name = n.name.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let seen = futures::stream::unfold(rx, |mut rx| async move {
                rx.changed().await.ok()?;
                let n = rx.borrow_and_update().clone();
                Some((n, rx))
            });
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = agent::run_node(client, gpus, opts, seen, shutdown).await {
                tracing::warn!(node = %name, error = %e, "agent stopped");
            }
        });
        Ok(())
    }

    /// The fleet's GpuNodes as last seen.
    pub fn views(&self) -> BTreeMap<String, NodeView> {
        lock(&self.shared.views).clone()
    }

    /// From now on, tracks the most nodes of `plan` changing at once.
    pub fn watch_plan(&self, plan: &str) {
        *lock(&self.shared.plan_watch) = Some(PlanWatch {
            plan: plan.to_string(),
            ..Default::default()
        });
    }

    pub fn plan_watch(&self) -> Option<PlanWatch> {
        lock(&self.shared.plan_watch).clone()
    }

    /// Stops every agent and the watch.
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Shared {
    fn seen(&self, n: &GpuNode) {
        let name = n.name_any();
        let view = NodeView::of(n);
        if let Some(tx) = lock(&self.wakers).get(&name) {
            // Only a new spec wakes the agent (its own status writes come back here too).
            tx.send_if_modified(|g| {
                let changed = g.as_ref().map(|g| g.metadata.generation) != Some(view.generation);
                if changed {
                    *g = Some(n.clone());
                }
                changed
            });
        }
        let mut views = lock(&self.views);
        views.insert(name, view);
        if let Some(w) = lock(&self.plan_watch).as_mut() {
            let of_plan = views.values().filter(|v| v.plan.as_deref() == Some(w.plan.as_str()));
            let (behind, unavailable) = of_plan.fold((0, 0), |(b, u), v| {
                (b + usize::from(v.behind()), u + usize::from(v.behind() || !v.ready))
            });
            w.max_behind = w.max_behind.max(behind);
            w.max_unavailable = w.max_unavailable.max(unavailable);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
