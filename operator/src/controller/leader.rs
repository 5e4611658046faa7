//! Leader election: of the controller's replicas (docs/design.md#components: a Deployment of 2), only the holder
//! of a `coordination.k8s.io/v1` Lease writes; the others keep their caches warm to take over.
//!
//! Built on `kube-lease-manager`, which locks the Lease with server-side apply (two replicas cannot
//! both acquire it) and renews it. Around it this module adds what a controller needs:
//!
//! - **Timing.** With lease duration `D` (default [`DEFAULT_LEASE_DURATION`], 15 s) the leader renews
//!   every `D − G`, where `G = max(1 s, D/3)` is the grace (5 s at the default: renew every 10 s,
//!   like client-go's 15 s / 10 s). A leader that crashes or is partitioned is replaced once its
//!   last renewal is `D` old: within `D` (15 s) plus up to 1 s of random back-off that the library
//!   adds against collisions and a few requests. `G` is also the clock skew between replicas that
//!   the lease tolerates.
//! - **Graceful hand-over.** [`Election::release`] (or dropping the [`Election`]) gives the Lease up
//!   at shutdown. The library alone would let a follower notice only when the released lease would
//!   have expired (up to `D` later); here every replica also watches the Lease and, as soon as it
//!   is free (released or deleted), tries to take it: a follower takes over within a request or two.
//! - **Fail safe on API errors.** When the Lease cannot be read or renewed, this replica stops
//!   being leader at once (`is_leader` becomes false) and retries with [`Backoff`] (1 s doubling up
//!   to `D`). It cannot write without the API server anyway, and another replica may take the
//!   lease once `D` has passed.
//! - **`--no-leader-election`.** [`Election::always_leader`] for a single replica and for tests.
//!
//! The watch channel in [`Election::is_leader`] says when to start and stop writing. Stop the
//! writer *before* calling [`Election::release`], so that two replicas never write at once.
//!
//! RBAC: `get`, `list`, `watch`, `create`, `patch` on `leases` (group `coordination.k8s.io`) in
//! the namespace of the Lease.

use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::runtime::backoff::Backoff;

/// The default lease duration: a crashed leader is replaced within about this long.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// The default name of the Lease.
pub const DEFAULT_LEASE_NAME: &str = "gpu-tenancy-controller";

/// How long shutdown waits for the Lease to be released before it gives up (the lease then simply
/// expires, as after a crash).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an election could not start or release.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("lease duration {0:?} is too short: the Lease counts whole seconds and needs at least 2")]
    Duration(Duration),
    #[error("leader election on Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error("releasing Lease {namespace}/{name} took longer than {RELEASE_TIMEOUT:?}; it expires on its own")]
    ReleaseTimeout { namespace: String, name: String },
    #[error("the leader election task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Lease duration and grace, in the whole seconds a Lease holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lock is valid after its last renewal.
    pub duration_s: u64,
    /// How long before expiry the holder renews; also the clock skew tolerated.
    pub grace_s: u64,
}

impl Timing {
    /// `D` whole seconds (at least 2) with grace `max(1, D/3)`.
    pub fn new(duration: Duration) -> Result<Timing, Error> {
        let duration_s = duration.as_secs();
        if duration_s < 2 {
            return Err(Error::Duration(duration));
        }
        Ok(Timing {
            duration_s,
            grace_s: (duration_s / 3).max(1),
        })
    }

    /// Time between two renewals by the holder (the lease manager's: its duration less grace).
    #[cfg(test)]
    pub fn renew_every(&self) -> Duration {
        Duration::from_secs(self.duration_s - self.grace_s)
    }
}

/// This replica's part in the election. Dropping it gives the lease up in the background; prefer
/// [`Election::release`], which waits for that.
#[derive(Debug)]
pub struct Election {
    /// True while this replica holds the lease and may write. After [`Election::release`] (or
    /// when the election task ends) it reads false and `changed()` returns an error.
    pub is_leader: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
    /// `always_leader` keeps its sender here: a closed channel would make `changed()` return at once.
    _always: Option<watch::Sender<bool>>,
}

impl Election {
    /// No election (`--no-leader-election`): always the leader. For a single replica and tests.
    pub fn always_leader() -> Election {
        let (tx, rx) = watch::channel(true);
        Election {
            is_leader: rx,
            stop: None,
            task: None,
            _always: Some(tx),
        }
    }

    /// Whether this replica is the leader now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Stops competing and, if this replica holds the lease, releases it so that a follower takes
    /// over at once. Waits up to 5 s for the API server. Stop writing before calling it.
    pub async fn release(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // The task releases the lease and ends (if the runtime is still running).
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Joins the election for Lease `namespace/lease_name` as `identity` (unique per replica: the pod
/// name), with lease duration `duration` (whole seconds, at least 2; see the module notes for the
/// timing). Creates the Lease when it does not exist. Returns once the Lease has been read, so an
/// unreachable API server or missing RBAC fails here; leadership then arrives on `is_leader`.
pub async fn start(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: &str,
    duration: Duration,
) -> Result<Election, Error> {
    let runner = Runner {
        client,
        namespace: namespace.to_owned(),
        lease_name: lease_name.to_owned(),
        identity: identity.to_owned(),
        timing: Timing::new(duration)?,
    };
    let manager = runner.build().await.map_err(|e| runner.error(e))?;
    let (tx, rx) = watch::channel(false);
    let (stop, stop_rx) = oneshot::channel();
    let task = tokio::spawn(runner.run(manager, tx, stop_rx));
    Ok(Election {
        is_leader: rx,
        stop: Some(stop),
        task: Some(task),
        _always: None,
    })
}

struct Runner {
    client: Client,
    namespace: String,
    lease_name: String,
    identity: String,
    timing: Timing,
}

/// What woke the election loop.
enum Step {
    Stop,
    Changed(Result<bool, LeaseManagerError>),
    LeaseFree,
}

impl Runner {
    async fn build(&self) -> Result<LeaseManager, LeaseManagerError> {
        LeaseManagerBuilder::new(self.client.clone(), &self.lease_name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.timing.duration_s)
            .with_grace(self.timing.grace_s)
            .build()
            .await
    }

    fn error(&self, source: LeaseManagerError) -> Error {
        Error::Lease {
            namespace: self.namespace.clone(),
            name: self.lease_name.clone(),
            source,
        }
    }

    /// Competes for the lease until `stop`, publishing leadership on `tx`; then releases it.
    async fn run(
        self,
        first: LeaseManager,
        tx: watch::Sender<bool>,
        mut stop: oneshot::Receiver<()>,
    ) -> Result<(), Error> {
        let mut manager = Some(first);
        let mut free = lease_free_events(&self.client, &self.namespace, &self.lease_name);
        // Never slower than a lease term, so a replica that lost the API server competes again
        // within about `D` of its return.
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(self.timing.duration_s));
        let mut wait = Duration::ZERO;
        loop {
            let Some(m) = manager.as_ref() else {
                // Rebuilding reads the lease afresh: after an error, or when it was freed.
                match self.rebuild(&mut stop, wait).await {
                    None => break,
                    Some(Ok(m)) => manager = Some(m),
                    Some(Err(error)) => {
                        wait = backoff.next();
                        tracing::warn!(lease = %self.lease_name, %error, retry_in = ?wait, "leader election: cannot read the lease");
                    }
                }
                continue;
            };
            let step = tokio::select! {
                biased;
                _ = &mut stop => Step::Stop,
                changed = m.changed() => Step::Changed(changed),
                Some(()) = free.next(), if !*tx.borrow() => Step::LeaseFree,
            };
            match self.take(step, &tx, &mut backoff) {
                Next::Stop => break,
                Next::Keep => {}
                Next::Rebuild(after) => {
                    manager = None;
                    wait = after;
                }
            }
        }
        // Stop writing first (the caller should have already), then hand the lease over.
        tx.send_replace(false);
        self.release(manager).await
    }

    /// A manager built afresh after `wait`; `None` when stopped first.
    async fn rebuild(
        &self,
        stop: &mut oneshot::Receiver<()>,
        wait: Duration,
    ) -> Option<Result<LeaseManager, LeaseManagerError>> {
        tokio::select! {
            biased;
            _ = stop => None,
            built = async {
                tokio::time::sleep(wait).await;
                self.build().await
            } => Some(built),
        }
    }

    /// What a step of the election means: leadership published on `tx`, and whether the
    /// manager is kept or built afresh (after how long).
    fn take(&self, step: Step, tx: &watch::Sender<bool>, backoff: &mut Backoff) -> Next {
        match step {
            Step::Stop => Next::Stop,
            Step::Changed(Ok(leader)) => {
                backoff.reset();
                if leader {
                    tracing::info!(lease = %self.lease_name, identity = %self.identity, "became the leader");
                } else {
                    tracing::warn!(lease = %self.lease_name, identity = %self.identity, "lost the leader lease");
                }
                tx.send_replace(leader);
                Next::Keep
            }
            Step::Changed(Err(error)) => {
                // Cannot tell whether the lease is still ours: stop writing, read it afresh.
                if tx.send_replace(false) {
                    tracing::warn!(lease = %self.lease_name, %error, "leader election: stepping down, the lease cannot be renewed");
                } else {
                    tracing::warn!(lease = %self.lease_name, %error, "leader election: the lease cannot be read");
                }
                Next::Rebuild(backoff.next())
            }
            Step::LeaseFree => {
                // The holder released it (or it was deleted): compete now, not at its old expiry.
                tracing::debug!(lease = %self.lease_name, "the lease is free; trying to take it");
                Next::Rebuild(Duration::ZERO)
            }
        }
    }

    /// Gives the lease up, if this replica has a manager, within [`RELEASE_TIMEOUT`].
    async fn release(self, manager: Option<LeaseManager>) -> Result<(), Error> {
        let Some(m) = manager else { return Ok(()) };
        match tokio::time::timeout(RELEASE_TIMEOUT, m.release()).await {
            Ok(Ok(())) => {
                tracing::info!(lease = %self.lease_name, identity = %self.identity, "released the leader lease");
                Ok(())
            }
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(Error::ReleaseTimeout {
                namespace: self.namespace,
                name: self.lease_name,
            }),
        }
    }
}

/// What the election loop does after a step.
enum Next {
    Stop,
    Keep,
    /// Build the manager afresh after this long.
    Rebuild(Duration),
}

/// One item each time the Lease is seen free: no holder, or deleted. Watch errors are retried
/// with kube's default backoff; the election works without this stream, only slower to hand over.
fn lease_free_events(client: &Client, namespace: &str, name: &str) -> BoxStream<'static, ()> {
    let api = Api::<Lease>::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher(api, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(event) if is_free(&event) => Some(()),
                Ok(_) => None,
                Err(error) => {
                    tracing::debug!(%error, "watching the leader lease");
                    None
                }
            }
        })
        .boxed()
}

/// Whether `event` shows the Lease without a holder.
fn is_free(event: &watcher::Event<Lease>) -> bool {
    match event {
        watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
            lease.spec.as_ref().and_then(|s| s.holder_identity.as_ref()).is_none()
        }
        watcher::Event::Delete(_) => true,
        watcher::Event::Init | watcher::Event::InitDone => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn timing_renews_a_third_before_expiry_and_refuses_sub_two_seconds() {
        let t = Timing::new(DEFAULT_LEASE_DURATION).unwrap();
        assert_eq!(
            t,
            Timing {
                duration_s: 15,
                grace_s: 5
            }
        );
        assert_eq!(t.renew_every(), Duration::from_secs(10));
        assert_eq!(
            Timing::new(Duration::from_secs(2)).unwrap(),
            Timing {
                duration_s: 2,
                grace_s: 1
            }
        );
        assert_eq!(Timing::new(Duration::from_millis(4_900)).unwrap().duration_s, 4);
        for short in [Duration::ZERO, Duration::from_millis(1_999)] {
            let err = Timing::new(short).unwrap_err();
            assert!(err.to_string().contains("at least 2"), "{err}");
        }
        // The library's own rule (it panics otherwise): 0 < grace < duration.
        for d in 2..200 {
            let t = Timing::new(Duration::from_secs(d)).unwrap();
            assert!(t.grace_s > 0 && t.grace_s < t.duration_s, "{t:?}");
        }
    }

    #[tokio::test]
    async fn always_leader_stays_leader_and_its_channel_stays_open() {
        let election = Election::always_leader();
        assert!(election.is_leader());
        let mut rx = election.is_leader.clone();
        // `changed()` neither returns (no change) nor fails (sender alive) while the election lives.
        let waited = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
        assert!(waited.is_err(), "no change and no closed channel");
        election.release().await.unwrap();
        assert!(rx.changed().await.is_err(), "closed after release");
    }

    fn lease(holder: Option<&str>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_lease_is_free_without_holder_or_when_deleted() {
        use watcher::Event;
        assert!(is_free(&Event::Apply(lease(None))));
        assert!(is_free(&Event::InitApply(lease(None))));
        assert!(is_free(&Event::Apply(Lease::default())), "no spec at all");
        assert!(is_free(&Event::Delete(lease(Some("a")))));
        assert!(!is_free(&Event::Apply(lease(Some("a")))));
        assert!(!is_free(&Event::InitApply(lease(Some("a")))));
        assert!(!is_free(&Event::Init));
        assert!(!is_free(&Event::InitDone));
    }

    #[test]
    fn errors_name_the_lease() {
        let e = Error::ReleaseTimeout {
            namespace: "gpu-system".into(),
            name: "gpu-tenancy-controller".into(),
        };
        assert!(e.to_string().contains("gpu-system/gpu-tenancy-controller"), "{e}");
    }
}
