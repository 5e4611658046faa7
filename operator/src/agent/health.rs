//! The watch of the GPUs' health beside the agent's passes (both modes): a blocking thread runs
//! the backend's event watch ([`Gpus::watch_health`]) into a [`HealthBook`]; each pass writes the
//! book into the status it publishes, and a change wakes a pass at once, so an unhealthy device
//! reaches the GpuNode (and, in DRA mode, its slice and the kubelet) within a second or two.

use crate::api::GpuNodeStatus;
use crate::gpu::Gpus;
use crate::gpu::health::HealthBook;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

pub struct HealthWatch {
    book: Arc<Mutex<HealthBook>>,
    /// The GPUs as the last pass read them: an instance's error is named by its MIG device.
    last: Arc<Mutex<Option<GpuNodeStatus>>>,
    changes: watch::Receiver<u64>,
    stop: Arc<AtomicBool>,
}

impl HealthWatch {
    /// Starts watching `gpus` on a blocking thread; it ends when the watch is dropped.
    pub fn start<G: Gpus + 'static>(gpus: Arc<G>) -> HealthWatch {
        let book = Arc::new(Mutex::new(HealthBook::default()));
        let last: Arc<Mutex<Option<GpuNodeStatus>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, changes) = watch::channel(0u64);
        let (b, l, s) = (book.clone(), last.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            gpus.watch_health(&s, &mut |signal| {
                let status = l.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let changed = b
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(signal, status.as_ref());
                if changed {
                    tx.send_modify(|n| *n += 1);
                }
            });
        });
        HealthWatch {
            book,
            last,
            changes,
            stop,
        }
    }

    /// Writes what is known of the devices' health into `status` (just read from the GPUs), and
    /// keeps the GPUs it names for the events to come.
    pub fn annotate(&self, status: &mut GpuNodeStatus) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(status.clone());
        self.book.lock().unwrap_or_else(|e| e.into_inner()).annotate(status);
    }

    /// Returns when the health of a device changed; never, for a backend without events.
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
