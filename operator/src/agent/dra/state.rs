//! Prepare and Unprepare as the kubelet calls them, over the node's devices and the checkpoint.
//!
//! Prepare, for a claim: read it from the API server (the kubelet sends only its name and UID),
//! take the devices allocated to it here, decide ([`super::prepare::plan`]), scrub what must be,
//! write the claim's CDI spec, record the devices in use, and only then answer with the CDI
//! device IDs. Each step is saved to the checkpoint before the next, so a kill between any two
//! leaves a state a restart continues from without ever answering with an unscrubbed device: a
//! scrub not recorded is done again; a claim recorded is answered from the record (Prepare is
//! idempotent, and the kubelet retries). Unprepare records the devices released by the claim's
//! tenant, removes the spec and the claim; for `scrubMemory: Always` it scrubs them at once, so the
//! next Prepare does not wait.

use super::cdi::{self, CdiContext, CdiError};
use super::checkpoint::{
    Checkpoint, CheckpointError, CheckpointFile, DeviceRecord, PreparedClaim, PreparedDevice, Verified,
};
use super::container_caps;
use super::devices::{DraDevice, Unit};
use super::evidence;
use super::pod_claims;
use super::pods;
use super::prepare::{self, ClaimView, Planned};
use super::refusal::Refusal;
use super::reservations;
use super::scrubs::ScrubFailed;
use crate::api::{GpuTenant, ScrubMemory};
use crate::gpu::Gpus;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use tokio::sync::Mutex;

/// Why one claim was not prepared or unprepared (the error the kubelet gets for it).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("reading ResourceClaim {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "ResourceClaim {namespace}/{name} is not the claim asked for (UID {found}, not {asked}): it was deleted and created again"
    )]
    Replaced {
        namespace: String,
        name: String,
        found: String,
        asked: String,
    },
    #[error(
        "claim UID {uid} was prepared as ResourceClaim {recorded}, not {namespace}/{name}; refused rather than answered from the record"
    )]
    NotAsRecorded {
        uid: String,
        recorded: String,
        namespace: String,
        name: String,
    },
    #[error(transparent)]
    Pod(#[from] pods::PodError),
    #[error("{0}")]
    Refused(Refusal),
    #[error("device {device} is busy: {why}")]
    Busy { device: String, why: String },
    #[error(transparent)]
    Reserved(#[from] reservations::Busy),
    #[error("scrubbing device {device} ({uuid}) failed: {error}; it is not handed over")]
    Scrub {
        device: String,
        uuid: String,
        error: ScrubFailed,
    },
    #[error(transparent)]
    Cdi(#[from] CdiError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// Why the GPUs could not be read for a Prepare.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Discover(#[from] crate::gpu::DiscoverError),
    /// The blocking thread that read them ended without an answer.
    #[error("{0}")]
    Stopped(tokio::task::JoinError),
}

/// Test hook: `GPU_TENANCY_DRA_ABORT_AT=<step>` aborts the process right after that step, as a
/// node crash or an OOM kill would, so the tests can show a restart never hands over a dirty
/// device (the simulated NVML library offers the same for NVML mutations).
fn step_done(step: &str) {
    if std::env::var("GPU_TENANCY_DRA_ABORT_AT").is_ok_and(|s| s == step) {
        eprintln!("gpu-tenancy agent: aborting after DRA step {step} as asked (GPU_TENANCY_DRA_ABORT_AT)");
        std::process::abort();
    }
}

struct Inner {
    cp: Checkpoint,
    devices: Vec<DraDevice>,
    /// Devices a Prepare in progress decided on, by name: no other claim gets them meanwhile.
    reserved: std::collections::HashMap<String, reservations::Reservation>,
    /// Scrubs completed so far, by the UUID they cleared: a Prepare that planned a scrub skips it
    /// when one of the same UUID completed after it planned (it joined that one, or came too late
    /// to: either way the memory was cleared after its decision).
    scrubbed: std::collections::HashMap<String, u64>,
}

/// The DRA mode's state: the node's devices as last published, and the checkpoint.
pub struct DraState<G: Gpus> {
    pub node: String,
    gpus: Arc<G>,
    client: Client,
    tenants: Store<GpuTenant>,
    file: CheckpointFile,
    cdi: CdiContext,
    inner: Mutex<Inner>,
    /// The checkpoint as last saved, for the GpuNode status (`status.claims`).
    saved: tokio::sync::watch::Sender<Checkpoint>,
    /// Scrubs running, by UUID.
    scrubs: super::scrubs::InFlight,
    /// The node's devices as last set, for the kubelet's health stream ([`super::health`]).
    published: tokio::sync::watch::Sender<Vec<DraDevice>>,
    /// The last reading of the GPUs for the idle checks, and when it started ([`DraState::idle`]).
    reading: tokio::sync::Mutex<Option<(std::time::Instant, Arc<crate::api::GpuNodeStatus>)>>,
}

/// The tenant `namespace` belongs to (the rule admission binds namespaces by,
/// [`crate::tenancy`]). The agent does not know the controller's exempt namespaces: a tenant that
/// lists one is invalid (the controller's check), is granted nothing, and so has no device here.
pub fn owner(tenants: &[Arc<GpuTenant>], namespace: &str) -> Option<String> {
    crate::tenancy::owner_of(tenants, namespace, &Default::default()).map(str::to_string)
}

impl<G: Gpus + 'static> DraState<G> {
    pub fn new(
        node: String,
        gpus: Arc<G>,
        client: Client,
        tenants: Store<GpuTenant>,
        file: CheckpointFile,
        cdi: CdiContext,
    ) -> Result<DraState<G>, CheckpointError> {
        let cp = match file.load() {
            Ok(cp) => cp,
            Err(e @ CheckpointError::Untrusted { .. }) => {
                // Fail closed: an unknown past, so every device is scrubbed before its next claim.
                tracing::error!(error = %e, "the DRA checkpoint is not trusted");
                file.set_aside()?;
                Checkpoint::default()
            }
            Err(e) => return Err(e),
        };
        let (saved, _) = tokio::sync::watch::channel(cp.clone());
        Ok(DraState {
            node,
            gpus,
            client,
            tenants,
            file,
            cdi,
            inner: Mutex::new(Inner {
                cp,
                devices: vec![],
                reserved: Default::default(),
                scrubbed: Default::default(),
            }),
            scrubs: super::scrubs::InFlight::default(),
            published: tokio::sync::watch::channel(vec![]).0,
            reading: Default::default(),
            saved,
        })
    }

    /// Saves the checkpoint, then tells the status publisher.
    fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        self.file.save(cp)?;
        self.saved.send_replace(cp.clone());
        Ok(())
    }

    /// The checkpoint as last saved, and its changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Checkpoint> {
        self.saved.subscribe()
    }

    /// The node's devices changed (a new GpuNode spec or status).
    pub async fn set_devices(&self, devices: Vec<DraDevice>) {
        self.published.send_if_modified(|d| {
            let changed = *d != devices;
            *d = devices.clone();
            changed
        });
        self.inner.lock().await.devices = devices;
    }

    /// The node's devices, as each [`DraState::set_devices`] sets them.
    pub fn watch_devices(&self) -> tokio::sync::watch::Receiver<Vec<DraDevice>> {
        self.published.subscribe()
    }

    /// The claim as the API server has it, refused unless it is the one asked about (its UID).
    async fn read_claim(&self, namespace: &str, name: &str, uid: &str) -> Result<ResourceClaim, ClaimError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let claim = api.get(name).await.map_err(|source| ClaimError::Read {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?;
        let found = claim.uid().unwrap_or_default();
        if found != uid {
            return Err(ClaimError::Replaced {
                namespace: namespace.into(),
                name: name.into(),
                found,
                asked: uid.into(),
            });
        }
        Ok(claim)
    }

    fn view(&self, claim: &ResourceClaim, tenant: Option<String>) -> ClaimView {
        ClaimView {
            uid: claim.uid().unwrap_or_default(),
            namespace: claim.namespace().unwrap_or_default(),
            name: claim.name_any(),
            tenant,
            allocated: pod_claims::devices_of(claim, Some(&self.node)),
        }
    }

    /// The GPUs as read after `asked`: Prepares that ask while a reading is under way wait for it
    /// and share the next one, so a hundred Prepares at once read the GPUs a few times, not a
    /// hundred times one after the other; none is answered with a reading older than its question.
    async fn read_gpus(&self, asked: std::time::Instant) -> Result<Arc<crate::api::GpuNodeStatus>, ReadError> {
        let mut last = self.reading.lock().await;
        if let Some((started, status)) = last.as_ref()
            && *started >= asked
        {
            return Ok(status.clone());
        }
        let started = std::time::Instant::now();
        let gpus = self.gpus.clone();
        let status = Arc::new(
            tokio::task::spawn_blocking(move || gpus.discover())
                .await
                .map_err(ReadError::Stopped)??,
        );
        *last = Some((started, status.clone()));
        Ok(status)
    }

    /// Refuses a device with processes on it (someone uses it outside any claim, or, for a share
    /// to scrub, another claim does), as the GPUs report them now.
    async fn idle(&self, p: &Planned) -> Result<(), ClaimError> {
        let status = self
            .read_gpus(std::time::Instant::now())
            .await
            .map_err(|e| ClaimError::Busy {
                device: p.device.name.clone(),
                why: format!("the GPUs could not be read: {e}"),
            })?;
        let Some(g) = status.gpus.iter().find(|g| g.index == p.device.gpu) else {
            return Err(ClaimError::Busy {
                device: p.device.name.clone(),
                why: "its GPU is not found".into(),
            });
        };
        let gi = p.device.instance_ids.map(|(gi, _)| gi);
        let pids: Vec<String> = g
            .processes
            .iter()
            .filter(|pr| gi.is_none() || pr.gpu_instance_id == gi)
            .map(|pr| pr.pid.to_string())
            .collect();
        if pids.is_empty() {
            Ok(())
        } else {
            Err(ClaimError::Busy {
                device: p.device.name.clone(),
                why: format!("processes run on it: pids {}", pids.join(", ")),
            })
        }
    }

    /// Scrubs `p`'s device, or joins the scrub of its UUID already running (a Prepare the kubelet
    /// retried after its deadline, another share of the GPU), and records it clean; nothing when a
    /// scrub of its UUID completed since the Prepare decided (`seen`: the count of completed scrubs
    /// then). The scrub runs on in a task of its own when the caller is dropped, and records its
    /// result itself.
    async fn scrub(self: &Arc<Self>, p: &Planned, seen: u64) -> Result<(), ClaimError> {
        let me = self.clone();
        let planned = p.clone();
        let run = async move {
            let gpus = me.gpus.clone();
            let uuid = planned.uuid.clone();
            // The GPU layer's scrub clears all free memory and checks every word of it on the
            // GPU; it fails unless all of it reads zero (gpu::scrub).
            let report = tokio::task::spawn_blocking(move || gpus.scrub(&uuid))
                .await
                .map_err(|e| ScrubFailed::Stopped(Arc::new(e)))?
                .map_err(|e| ScrubFailed::Gpu(Arc::new(e)))?;
            let verified = Verified {
                bytes: report.bytes_verified,
                at: evidence::now(),
            };
            me.record_clean(&planned, verified)
                .await
                .map_err(|e| ScrubFailed::Record(Arc::new(e)))
        };
        // Decided and joined under the state's lock, which a scrub's record takes too: a scrub
        // either completed before (and is counted) or is joined, never missed in between.
        let joined = {
            let inner = self.inner.lock().await;
            if inner.scrubbed.get(&p.uuid).copied().unwrap_or(0) > seen {
                return Ok(());
            }
            self.scrubs.start_or_join(&p.uuid, run)
        };
        joined.await.map_err(|error| ClaimError::Scrub {
            device: p.device.name.clone(),
            uuid: p.uuid.clone(),
            error,
        })
    }

    /// Records `p`'s device clean after its scrub, after the tenant whose release it was (its
    /// record, unless another claim holds it or the device is another one now). A share's scrub
    /// cleared its whole GPU, so every share of that GPU no claim holds is recorded clean with it:
    /// else each other share would need a scrub of its own, refused while the first one is held.
    /// `verified`: what the scrub read back, the next hand-over's evidence.
    async fn record_clean(&self, p: &Planned, verified: Verified) -> Result<(), CheckpointError> {
        let mut inner = self.inner.lock().await;
        *inner.scrubbed.entry(p.uuid.clone()).or_default() += 1;
        let names: Vec<String> = match prepare::is_share(&p.device) {
            true => inner
                .devices
                .iter()
                .filter(|d| d.gpu == p.device.gpu && prepare::is_share(d) && d.uuid.as_deref() == Some(&p.uuid))
                .map(|d| d.name.clone())
                .chain(std::iter::once(p.device.name.clone()))
                .collect(),
            false => vec![p.device.name.clone()],
        };
        for name in names {
            let tenant = match inner.cp.devices.get(&name) {
                // A record of another UUID is another device's (one created again after a
                // reboot, its claim prepared again), even one in use: its past is unknown.
                Some(r) if r.uuid() != p.uuid => None,
                // A holder of this very device keeps its record.
                Some(DeviceRecord::InUse { .. }) => continue,
                Some(DeviceRecord::Released { tenant, .. }) => Some(tenant.clone()),
                Some(DeviceRecord::Clean { tenant, .. }) => tenant.clone(),
                None => None,
            };
            inner.cp.devices.insert(
                name,
                DeviceRecord::Clean {
                    uuid: p.uuid.clone(),
                    tenant,
                    verified: Some(verified.clone()),
                },
            );
        }
        self.save(&inner.cp)
    }

    /// Checks the pods `claim` (of `tenant`) is reserved for ([`pods::check`]): their devices
    /// against the tenant's `maxGpusPerPod`, their containers' memory caps against the claim's.
    /// The claim's cap as checked.
    async fn check_pods(&self, claim: &ResourceClaim, tenant: &str) -> Result<Option<u64>, ClaimError> {
        let max = self
            .tenants
            .state()
            .iter()
            .find(|x| x.name_any() == tenant)
            .and_then(|x| x.spec.limits.as_ref().and_then(|l| l.max_gpus_per_pod));
        // The device table as now, to tell the claims' memory caps (a spec written later is
        // written from a table as new or newer, and checked against this one); a claim prepared
        // here is told by the spec written for it.
        let (devices, written) = {
            let inner = self.inner.lock().await;
            let written: std::collections::BTreeMap<_, _> = inner
                .cp
                .claims
                .iter()
                .map(|(uid, c)| (uid.clone(), container_caps::written_cap(&c.cdi_spec)))
                .collect();
            (inner.devices.clone(), written)
        };
        let own = claim
            .uid()
            .and_then(|u| written.get(&u).cloned())
            .unwrap_or_else(|| container_caps::claim_cap(claim, &self.node, &devices));
        let cap = match own {
            container_caps::ClaimCap::Mib(mib) => Some(mib),
            // Its own devices are checked by the plan, which refuses what it cannot tell; a
            // spec this agent wrote sets one value.
            container_caps::ClaimCap::None | container_caps::ClaimCap::Unknown { .. } => None,
        };
        let checks = pods::PodChecks {
            tenant,
            max,
            cap,
            pool: &self.node,
            devices: &devices,
            written: &written,
        };
        pods::check(&self.client, claim, &checks).await?;
        Ok(cap)
    }

    /// Prepares claim `uid` (`namespace/name`); the CDI device IDs per (request, device).
    ///
    /// Claims on different devices prepare at once: the state is locked only to decide and to
    /// record, never across a read of the GPUs or a scrub, and the devices a Prepare in progress
    /// decided on are reserved for its claim meanwhile.
    pub async fn prepare(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        // The claim asked about is checked against the API server's (namespace, name, UID) and
        // its pod's device count before anything recorded answers for it.
        let claim = self.read_claim(namespace, name, uid).await?;
        let tenant = owner(&self.tenants.state(), namespace);
        let checked_cap = match tenant.as_deref() {
            Some(t) => self.check_pods(&claim, t).await?,
            None => None,
        };
        let view = self.view(&claim, tenant);
        let planned = {
            let mut inner = self.inner.lock().await;
            if let Some(done) = self.answered(&mut inner, &view)? {
                return Ok(done);
            }
            let mut planned = prepare::plan(&inner.cp, &view, &inner.devices).map_err(ClaimError::Refused)?;
            // The spec is written from the plan's devices: their cap must be the one checked
            // against the pod's other claims (the table may have changed between the two).
            let held: Vec<(&DraDevice, &str)> = planned.iter().map(|p| (&p.device, p.uuid.as_str())).collect();
            if cdi::claim_cap_mib(&held) != checked_cap {
                return Err(ClaimError::Refused(Refusal::NotReady {
                    device: planned.first().map(|p| p.device.name.clone()).unwrap_or_default(),
                    why: "its GPU's memory cap changed while the claim was checked",
                }));
            }
            let Inner {
                cp, devices, reserved, ..
            } = &mut *inner;
            reservations::reserve(reserved, cp, devices, uid, &mut planned)?;
            let seen: std::collections::HashMap<String, u64> = planned
                .iter()
                .map(|p| (p.uuid.clone(), inner.scrubbed.get(&p.uuid).copied().unwrap_or(0)))
                .collect();
            (planned, seen)
        };
        let (planned, seen) = planned;
        let result = self.prepare_planned(&view, &planned, &seen).await;
        let mut inner = self.inner.lock().await;
        for p in &planned {
            if inner.reserved.get(&p.device.name).is_some_and(|r| r.claim() == uid) {
                inner.reserved.remove(&p.device.name);
            }
        }
        result
    }

    /// The recorded answer for `view`'s claim, if it still holds (its spec written again where it
    /// is missing or changed); `None` when there is none, or when a device of it is another one
    /// now (the record is dropped: prepared again, scrubbed first).
    fn answered(&self, inner: &mut Inner, view: &ClaimView) -> Result<Option<Vec<PreparedDevice>>, ClaimError> {
        let (uid, namespace, name) = (view.uid.as_str(), view.namespace.as_str(), view.name.as_str());
        let Some(done) = inner.cp.claims.get(uid) else {
            return Ok(None);
        };
        if done.namespace != namespace || done.name != name {
            return Err(ClaimError::NotAsRecorded {
                uid: uid.into(),
                recorded: format!("{}/{}", done.namespace, done.name),
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        let names: Vec<String> = done.devices.iter().map(|d| d.device.clone()).collect();
        match prepare::recorded(&inner.cp, uid, &names, &inner.devices) {
            prepare::Recorded::Holds => {
                // A reboot empties the runtime's CDI directory (a tmpfs): written again.
                if let Some(why) = cdi::restore(&self.cdi.dir, uid, &done.cdi_spec)? {
                    tracing::warn!(claim = %format!("{namespace}/{name}"), %why, "the claim's CDI spec was missing or changed behind the agent; written again");
                }
                Ok(Some(done.devices.clone()))
            }
            prepare::Recorded::Unknown { device } => Err(ClaimError::Refused(Refusal::NotReady {
                device,
                why: "its UUID is not known yet",
            })),
            prepare::Recorded::Changed { device } => {
                tracing::warn!(claim = %format!("{namespace}/{name}"), %device, "a device of the prepared claim is another one now (created again after a reboot?); prepared again, scrubbed first");
                inner.cp.claims.remove(uid);
                Ok(None)
            }
        }
    }

    /// Prepare's work once its devices are decided and reserved: each checked idle and scrubbed
    /// where it must be (no lock held), then its spec written and the claim recorded.
    async fn prepare_planned(
        self: &Arc<Self>,
        view: &ClaimView,
        planned: &[Planned],
        seen: &std::collections::HashMap<String, u64>,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        for p in planned {
            let seen = seen.get(&p.uuid).copied().unwrap_or(0);
            let scrubbed_since = || async {
                let inner = self.inner.lock().await;
                inner.scrubbed.get(&p.uuid).copied().unwrap_or(0) > seen
            };
            if p.scrub && scrubbed_since().await {
                continue;
            }
            if p.scrub || !prepare::is_share(&p.device) {
                self.idle(p).await?;
            }
            if p.scrub {
                self.scrub(p, seen).await?;
                step_done("prepare-scrubbed");
            }
        }
        let uid = view.uid.as_str();
        let tenant = view.tenant.clone().unwrap_or_default();
        let pairs: Vec<(&DraDevice, &str)> = planned.iter().map(|p| (&p.device, p.uuid.as_str())).collect();
        let (spec, ids) = cdi::spec(&self.cdi, uid, &tenant, &pairs)?;
        let mut inner = self.inner.lock().await;
        cdi::write(&self.cdi.dir, uid, &spec)?;
        step_done("prepare-cdi-written");
        // The evidence from each device's record before this claim's replaces it.
        let now = evidence::now();
        let devices: Vec<PreparedDevice> = planned
            .iter()
            .zip(ids)
            .map(|(p, ids)| PreparedDevice {
                request: p.request.clone(),
                device: p.device.name.clone(),
                cdi_device_ids: ids,
                evidence: evidence::evidence(
                    inner.cp.devices.get(&p.device.name),
                    &p.uuid,
                    &tenant,
                    p.device.scrub,
                    &now,
                ),
            })
            .collect();
        for p in planned {
            inner.cp.devices.insert(
                p.device.name.clone(),
                DeviceRecord::InUse {
                    claim: uid.into(),
                    tenant: tenant.clone(),
                    uuid: p.uuid.clone(),
                },
            );
            if prepare::is_share(&p.device) {
                let Inner { cp, devices, .. } = &mut *inner;
                reservations::shared_gpu_used(cp, devices, p, &tenant);
            }
        }
        inner.cp.claims.insert(
            uid.into(),
            PreparedClaim {
                namespace: view.namespace.clone(),
                name: view.name.clone(),
                tenant,
                devices: devices.clone(),
                cdi_spec: spec,
            },
        );
        self.save(&inner.cp)?;
        step_done("prepare-recorded");
        Ok(devices)
    }

    /// Unprepares claim `uid`: its devices are released by its tenant. A claim not prepared here
    /// (or already unprepared) is done.
    pub async fn unprepare(self: &Arc<Self>, uid: &str) -> Result<(), ClaimError> {
        let (claim, always) = {
            let mut inner = self.inner.lock().await;
            let Some(claim) = inner.cp.claims.get(uid).cloned() else {
                cdi::remove(&self.cdi.dir, uid)?;
                return Ok(());
            };
            for d in &claim.devices {
                if let Some(DeviceRecord::InUse { claim: c, uuid, .. }) = inner.cp.devices.get(&d.device).cloned()
                    && c == uid
                {
                    inner.cp.devices.insert(
                        d.device.clone(),
                        DeviceRecord::Released {
                            tenant: claim.tenant.clone(),
                            uuid,
                        },
                    );
                }
            }
            self.save(&inner.cp)?;
            step_done("unprepare-released");
            cdi::remove(&self.cdi.dir, uid)?;
            inner.cp.claims.remove(uid);
            self.save(&inner.cp)?;
            step_done("unprepare-recorded");
            let always: Vec<Planned> = claim
                .devices
                .iter()
                .filter_map(|pd| {
                    let d = inner.devices.iter().find(|d| d.name == pd.device)?;
                    let uuid = inner.cp.devices.get(&pd.device)?.uuid().to_string();
                    (d.scrub == ScrubMemory::Always && !matches!(d.unit, Unit::Share { .. })).then(|| Planned {
                        request: pd.request.clone(),
                        device: d.clone(),
                        uuid,
                        scrub: true,
                    })
                })
                .collect();
            (claim, always)
        };
        // `scrubMemory: Always` scrubs between any two claims: do it now, ahead of the next one
        // (a Prepare that comes meanwhile joins it). A failure here is the next Prepare's scrub.
        for p in always {
            if self.idle(&p).await.is_ok()
                // Released just now: no earlier scrub counts.
                && let Err(e) = self.scrub(&p, u64::MAX).await
            {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %e, "the scrub after the claim failed; the next claim's Prepare scrubs");
            }
        }
        Ok(())
    }
}
