//! Device health (pure): what the driver reports through NVML's event sets, kept per GPU and per
//! MIG device, and written into the GpuNode's status (`unhealthy` of a GPU or an instance), which
//! both agent modes publish and the DRA mode turns into device taints and the kubelet's health
//! stream (docs/concepts/health.md).
//!
//! What counts follows NVIDIA's device plugin and DRA driver: an XID error marks its device
//! unhealthy unless it is one of the XIDs an application causes on a healthy GPU
//! ([`APPLICATION_XIDS`]); an XID in a MIG instance (the event carries its GPU and compute
//! instance) marks that instance only, any other the whole GPU. Beyond them, fail closed: an
//! uncorrectable ECC error marks the GPU, a GPU whose events cannot be watched is `Unmonitored`,
//! a GPU NVML cannot read is `Unreadable`, and while waiting for events fails every GPU is
//! unhealthy (an error could go unseen).
//!
//! A mark stays until the agent restarts: NVIDIA's plugins never bring a device back either, and
//! what the driver reports calls for a GPU reset or a reboot, after which the agent starts anew.

use crate::api::{GpuNodeStatus, GpuReason, HealthReason, Unhealthy};
use std::collections::BTreeMap;

/// XIDs an application causes on a healthy GPU (NVIDIA's "application errors"; the device plugin
/// skips the same): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
/// processing, 45 preemptive cleanup, 68 video processor exception.
pub const APPLICATION_XIDS: [u64; 5] = [13, 31, 43, 45, 68];

/// What the driver reported on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverError {
    Xid(u64),
    EccUncorrectable,
}

/// What the watch of the GPUs' events tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthSignal {
    /// The driver reported `error` on GPU `gpu` (its UUID), in the GPU instance `gpu_instance` (and
    /// compute instance) when it was in one.
    Reported {
        gpu: String,
        error: DriverError,
        gpu_instance: Option<u32>,
        compute_instance: Option<u32>,
    },
    /// Events of GPU `gpu` cannot be watched.
    Unmonitored { gpu: String, error: String },
    /// Waiting for events failed: nothing is known of any GPU until a wait succeeds.
    WaitFailed(String),
    /// A wait ended normally (an event or none before its timeout).
    Waited,
}

/// The marks so far, by device UUID (a GPU's, a MIG device's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthBook {
    marks: BTreeMap<String, Unhealthy>,
    wait_failure: Option<String>,
}

impl HealthBook {
    /// Records `signal`; `status` (the GPUs as last read) names the MIG device an instance's
    /// error was in. Returns whether anything changed.
    pub fn record(&mut self, signal: HealthSignal, status: Option<&GpuNodeStatus>) -> bool {
        match signal {
            HealthSignal::Reported {
                gpu,
                error,
                gpu_instance,
                compute_instance,
            } => {
                let (reason, message) = match error {
                    DriverError::Xid(xid) if APPLICATION_XIDS.contains(&xid) => return false,
                    DriverError::Xid(xid) => (HealthReason::Xid, format!("the driver reported XID {xid}")),
                    DriverError::EccUncorrectable => (
                        HealthReason::EccUncorrectable,
                        "the driver reported an uncorrectable ECC error".to_string(),
                    ),
                };
                let device = match (gpu_instance, compute_instance) {
                    (Some(gi), Some(ci)) => instance_uuid(status, &gpu, gi, ci).unwrap_or(gpu),
                    _ => gpu,
                };
                self.mark(device, reason, message)
            }
            HealthSignal::Unmonitored { gpu, error } => self.mark(
                gpu,
                HealthReason::Unmonitored,
                format!("the agent cannot watch its errors: {error}"),
            ),
            HealthSignal::WaitFailed(error) => {
                let changed = self.wait_failure.as_ref() != Some(&error);
                self.wait_failure = Some(error);
                changed
            }
            HealthSignal::Waited => self.wait_failure.take().is_some(),
        }
    }

    /// The first mark of a device stays: it says what went wrong first.
    fn mark(&mut self, device: String, reason: HealthReason, message: String) -> bool {
        if self.marks.contains_key(&device) {
            return false;
        }
        tracing::warn!(device = %device, reason = reason.as_str(), %message, "device unhealthy");
        self.marks.insert(device, Unhealthy { reason, message });
        true
    }

    /// Writes the marks into `status`: each GPU's and MIG instance's `unhealthy`, and a GPU that
    /// NVML cannot read is unhealthy while it cannot.
    pub fn annotate(&self, status: &mut GpuNodeStatus) {
        for g in &mut status.gpus {
            g.unhealthy = if g.reason == Some(GpuReason::Unreadable) {
                Some(Unhealthy {
                    reason: HealthReason::Unreadable,
                    message: g.message.clone().unwrap_or_else(|| "NVML cannot read the GPU".into()),
                })
            } else if let Some(e) = &self.wait_failure {
                Some(Unhealthy {
                    reason: HealthReason::Unmonitored,
                    message: format!("waiting for the driver's error events failed: {e}"),
                })
            } else {
                self.marks.get(&g.uuid).cloned()
            };
            for i in &mut g.instances {
                i.unhealthy = i.uuid.as_ref().and_then(|u| self.marks.get(u)).cloned();
            }
        }
    }
}

/// The MIG device of GPU `gpu` at GPU instance `gi` and compute instance `ci`, if the status
/// knows it (else the whole GPU is marked: the instance may be one the status has not seen yet).
fn instance_uuid(status: Option<&GpuNodeStatus>, gpu: &str, gi: u32, ci: u32) -> Option<String> {
    status?
        .gpus
        .iter()
        .find(|g| g.uuid == gpu)?
        .instances
        .iter()
        .find(|i| i.gpu_instance_id == gi && i.compute_instance_id.is_none_or(|c| c == ci))?
        .uuid
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuStatus, MigInstanceStatus};

    fn status() -> GpuNodeStatus {
        GpuNodeStatus {
            gpus: vec![
                GpuStatus {
                    index: 0,
                    uuid: "GPU-a".into(),
                    instances: vec![
                        MigInstanceStatus {
                            gpu_instance_id: 5,
                            compute_instance_id: Some(0),
                            uuid: Some("MIG-a5".into()),
                            ..Default::default()
                        },
                        MigInstanceStatus {
                            gpu_instance_id: 6,
                            compute_instance_id: Some(0),
                            uuid: Some("MIG-a6".into()),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
                GpuStatus {
                    index: 1,
                    uuid: "GPU-b".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn xid(gpu: &str, xid: u64, gi: Option<u32>) -> HealthSignal {
        HealthSignal::Reported {
            gpu: gpu.into(),
            error: DriverError::Xid(xid),
            gpu_instance: gi,
            compute_instance: gi.map(|_| 0),
        }
    }

    fn reasons(s: &GpuNodeStatus) -> Vec<Option<HealthReason>> {
        s.gpus
            .iter()
            .flat_map(|g| {
                std::iter::once(g.unhealthy.as_ref().map(|u| u.reason))
                    .chain(g.instances.iter().map(|i| i.unhealthy.as_ref().map(|u| u.reason)))
            })
            .collect()
    }

    #[test]
    fn an_application_xid_changes_nothing_another_marks_its_device() {
        let mut book = HealthBook::default();
        let st = status();
        for x in APPLICATION_XIDS {
            assert!(!book.record(xid("GPU-b", x, None), Some(&st)));
        }
        assert!(book.record(xid("GPU-b", 79, None), Some(&st)));
        // The first reason stays.
        assert!(!book.record(xid("GPU-b", 48, None), Some(&st)));
        let mut out = st.clone();
        book.annotate(&mut out);
        assert_eq!(reasons(&out), [None, None, None, Some(HealthReason::Xid)]);
        assert!(out.gpus[1].unhealthy.as_ref().unwrap().message.contains("XID 79"));
    }

    #[test]
    fn an_instances_xid_marks_that_instance_and_an_unknown_instance_the_gpu() {
        let mut book = HealthBook::default();
        let st = status();
        assert!(book.record(xid("GPU-a", 94, Some(6)), Some(&st)));
        let mut out = st.clone();
        book.annotate(&mut out);
        assert_eq!(reasons(&out), [None, None, Some(HealthReason::Xid), None]);
        // An instance the status has not seen: the whole GPU.
        assert!(book.record(xid("GPU-a", 94, Some(9)), Some(&st)));
        book.annotate(&mut out);
        assert_eq!(
            out.gpus[0].unhealthy.as_ref().map(|u| u.reason),
            Some(HealthReason::Xid)
        );
    }

    #[test]
    fn failing_waits_unreadable_gpus_and_ecc_fail_closed() {
        let mut book = HealthBook::default();
        let mut st = status();
        st.gpus[0].reason = Some(GpuReason::Unreadable);
        st.gpus[0].message = Some("GPU_IS_LOST".into());
        book.annotate(&mut st);
        assert_eq!(reasons(&st)[0], Some(HealthReason::Unreadable));
        assert_eq!(reasons(&st)[3], None);

        assert!(book.record(HealthSignal::WaitFailed("Unknown Error".into()), None));
        book.annotate(&mut st);
        assert_eq!(reasons(&st)[3], Some(HealthReason::Unmonitored));
        assert!(book.record(HealthSignal::Waited, None));
        assert!(!book.record(HealthSignal::Waited, None));
        book.annotate(&mut st);
        assert_eq!(reasons(&st)[3], None);

        let ecc = HealthSignal::Reported {
            gpu: "GPU-b".into(),
            error: DriverError::EccUncorrectable,
            gpu_instance: None,
            compute_instance: None,
        };
        assert!(book.record(ecc, None));
        assert!(book.record(
            HealthSignal::Unmonitored {
                gpu: "GPU-a".into(),
                error: "NOT_SUPPORTED".into()
            },
            None
        ));
        st.gpus[0].reason = None;
        book.annotate(&mut st);
        assert_eq!(
            reasons(&st),
            [
                Some(HealthReason::Unmonitored),
                None,
                None,
                Some(HealthReason::EccUncorrectable)
            ]
        );
    }
}
