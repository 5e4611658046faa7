//! Scrubs in flight, by the UUID they clear: a Prepare that needs a scrub already running (the
//! kubelet's retry after its deadline dropped the first Prepare, another share of the same GPU, an
//! Unprepare's scrub under `scrubMemory: Always`) waits for that one instead of starting a second.
//! Each scrub runs in a task of its own, so it finishes, and records its result, even when every
//! caller waiting for it is gone.

use super::checkpoint::CheckpointError;
use crate::gpu::scrub::ScrubError;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Why a scrub did not clear its device, as every caller waiting for it gets it (shared, so the
/// sources are too).
#[derive(Clone, Debug, thiserror::Error)]
pub enum ScrubFailed {
    #[error(transparent)]
    Gpu(Arc<ScrubError>),
    /// The blocking thread that ran the GPU layer's scrub ended without an answer.
    #[error("{0}")]
    Stopped(Arc<tokio::task::JoinError>),
    /// Cleared, but the record of it could not be saved: not handed over.
    #[error(transparent)]
    Record(Arc<CheckpointError>),
    #[error("the scrub task failed: {0}")]
    Task(Arc<tokio::task::JoinError>),
}

type Scrub = Shared<BoxFuture<'static, Result<(), ScrubFailed>>>;

#[derive(Default)]
pub struct InFlight {
    running: Arc<Mutex<HashMap<String, Scrub>>>,
}

impl InFlight {
    /// Waits for the scrub of `uuid` running now, or starts `scrub` as it and waits for it.
    pub async fn run<F>(&self, uuid: &str, scrub: F) -> Result<(), ScrubFailed>
    where
        F: std::future::Future<Output = Result<(), ScrubFailed>> + Send + 'static,
    {
        self.start_or_join(uuid, scrub).await
    }

    /// The scrub of `uuid` running now, or `scrub` started as it: the caller decides under its own
    /// lock whether a scrub is still due and joins one without waiting for it there.
    pub fn start_or_join<F>(&self, uuid: &str, scrub: F) -> Scrub
    where
        F: std::future::Future<Output = Result<(), ScrubFailed>> + Send + 'static,
    {
        let mut running = self.running.lock().expect("the scrubs' map is never poisoned");
        match running.get(uuid) {
            Some(s) => s.clone(),
            None => {
                let map = self.running.clone();
                let key = uuid.to_string();
                let task = tokio::spawn(async move {
                    let result = scrub.await;
                    map.lock().expect("the scrubs' map is never poisoned").remove(&key);
                    result
                });
                let s: Scrub = async move { task.await.map_err(|e| ScrubFailed::Task(Arc::new(e)))? }
                    .boxed()
                    .shared();
                running.insert(uuid.to_string(), s.clone());
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn refused(why: &str) -> ScrubFailed {
        ScrubFailed::Gpu(Arc::new(ScrubError::Refused {
            device: "GPU-0".into(),
            why: why.into(),
        }))
    }

    /// Two callers of one UUID get one scrub; a caller dropped before it ends leaves it running;
    /// another UUID's scrub runs beside it (GPU-0's waits until GPU-1's has started: run one
    /// after the other, they would never end).
    #[tokio::test]
    async fn one_scrub_per_uuid_at_a_time_and_it_outlives_its_callers() {
        let inflight = Arc::new(InFlight::default());
        let started = Arc::new(AtomicUsize::new(0));
        let gpu1_started = Arc::new(tokio::sync::Notify::new());
        let gpu0 = {
            let (started, gpu1_started) = (started.clone(), gpu1_started.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                gpu1_started.notified().await;
                Ok(())
            }
        };
        let first = tokio::spawn({
            let i = inflight.clone();
            async move { i.run("GPU-0", gpu0).await }
        });
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // The kubelet's deadline drops the first caller; its retry joins the same scrub.
        first.abort();
        let never = async { Err(refused("a second scrub of GPU-0 started")) };
        let retry = inflight.run("GPU-0", never);
        let gpu1 = {
            let (started, gpu1_started) = (started.clone(), gpu1_started.clone());
            inflight.run("GPU-1", async move {
                started.fetch_add(1, Ordering::SeqCst);
                gpu1_started.notify_one();
                Ok(())
            })
        };
        let both = tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(retry, gpu1) }).await;
        let (retry, gpu1) = both.expect("the two GPUs' scrubs ran one after the other");
        assert!(retry.is_ok() && gpu1.is_ok(), "{retry:?} {gpu1:?}");
        assert_eq!(started.load(Ordering::SeqCst), 2, "one scrub for GPU-0, one for GPU-1");
        // Finished: the next scrub of GPU-0 is a new one.
        let again = inflight.run("GPU-0", async { Err(refused("scrubbed anew")) }).await;
        assert_eq!(
            again.map_err(|e| e.to_string()),
            Err("scrub of GPU-0: scrubbed anew".to_string())
        );
    }
}
