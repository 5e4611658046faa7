//! The kubelet's `DRAResourceHealth` service (KEP-4680, on by default from Kubernetes 1.36): a
//! stream of every device's health, which the kubelet shows in the status of the pods that hold
//! the device (`allocatedResourcesStatus`). A device is unhealthy when its GpuNode says so
//! (`unhealthy` of its GPU or MIG instance, from the driver's events: docs/concepts/health.md),
//! healthy otherwise; readiness (`not-ready` taints) is another matter and not reported here.
//!
//! Served in both versions the kubelets of 1.34-1.37 know, `v1` and `v1alpha1`, listed at
//! registration. The kubelet forgets a device's health once `health_check_timeout_seconds` pass
//! without a report (it reads as Unknown then), so the whole list is sent at the start of each
//! stream, at every change, and again every [`REPORT_EVERY`].

use super::devices::DraDevice;
use crate::agent::kubelet_api::{v1, v1alpha1};
use futures::Stream;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// How often the list is sent again when nothing changed.
pub const REPORT_EVERY: Duration = Duration::from_secs(20);
/// How long the kubelet keeps a report: three missed reports.
const TIMEOUT_SECONDS: i64 = 60;

/// One device's health as both versions carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub pool: String,
    pub device: String,
    pub healthy: bool,
    pub message: String,
}

/// The health of every device of pool `pool` (the node's name).
pub fn reports(pool: &str, devices: &[DraDevice]) -> Vec<Report> {
    devices
        .iter()
        .map(|d| Report {
            pool: pool.to_string(),
            device: d.name.clone(),
            healthy: d.unhealthy.is_none(),
            message: d
                .unhealthy
                .as_ref()
                .map(|u| format!("{}: {}", u.reason.as_str(), u.message))
                .unwrap_or_default(),
        })
        .collect()
}

/// Reports as they are due: at once, on every change of the devices, and every [`REPORT_EVERY`];
/// ends when the devices' sender goes (the plugin stops).
fn due(pool: String, devices: watch::Receiver<Vec<DraDevice>>) -> impl Stream<Item = Vec<Report>> + Send {
    futures::stream::unfold((devices, true), move |(mut rx, first)| {
        let pool = pool.clone();
        async move {
            if !first && let Ok(Err(_)) = tokio::time::timeout(REPORT_EVERY, rx.changed()).await {
                return None;
            }
            let now = reports(&pool, &rx.borrow_and_update());
            Some((now, (rx, false)))
        }
    })
}

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn now_seconds() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The v1 response to `reports`, stamped now.
fn response(reports: Vec<Report>) -> v1::NodeWatchResourcesResponse {
    let at = now_seconds();
    v1::NodeWatchResourcesResponse {
        devices: reports
            .into_iter()
            .map(|r| v1::DeviceHealth {
                device: Some(v1::DeviceIdentifier {
                    pool_name: r.pool,
                    device_name: r.device,
                }),
                health: match r.healthy {
                    true => v1::HealthStatus::Healthy,
                    false => v1::HealthStatus::Unhealthy,
                } as i32,
                last_updated_time: at,
                health_check_timeout_seconds: TIMEOUT_SECONDS,
                message: r.message,
            })
            .collect(),
    }
}

/// The same response in v1alpha1's messages (the same fields and numbers).
fn alpha(r: v1::NodeWatchResourcesResponse) -> v1alpha1::NodeWatchResourcesResponse {
    v1alpha1::NodeWatchResourcesResponse {
        devices: r
            .devices
            .into_iter()
            .map(|d| v1alpha1::DeviceHealth {
                device: d.device.map(|i| v1alpha1::DeviceIdentifier {
                    pool_name: i.pool_name,
                    device_name: i.device_name,
                }),
                health: d.health,
                last_updated_time: d.last_updated_time,
                health_check_timeout_seconds: d.health_check_timeout_seconds,
                message: d.message,
            })
            .collect(),
    }
}

pub struct Health {
    pub pool: String,
    pub devices: watch::Receiver<Vec<DraDevice>>,
}

impl Health {
    fn stream(&self) -> impl Stream<Item = v1::NodeWatchResourcesResponse> + Send + 'static {
        futures::StreamExt::map(due(self.pool.clone(), self.devices.clone()), response)
    }
}

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = Streamed<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(Box::pin(futures::StreamExt::map(self.stream(), Ok))))
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = Streamed<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(Box::pin(futures::StreamExt::map(self.stream(), |r| {
            Ok(alpha(r))
        }))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::dra::devices::{DraDevice, Unit};
    use crate::api::{HealthReason, Mode, ScrubMemory, Unhealthy};
    use futures::StreamExt;

    fn dev(name: &str, unhealthy: Option<HealthReason>) -> DraDevice {
        DraDevice {
            name: name.into(),
            gpu: 0,
            unit: Unit::Gpu,
            mode: Mode::Exclusive,
            tenant: None,
            profile: None,
            uuid: None,
            parent_uuid: None,
            product_name: String::new(),
            numa_node: None,
            memory_mib: 0,
            mps: None,
            memory_cap: None,
            scrub: ScrubMemory::OnTenantChange,
            not_ready: None,
            unhealthy: unhealthy.map(|reason| Unhealthy {
                reason,
                message: "the driver reported XID 79".into(),
            }),
            minor: None,
            instance_ids: None,
        }
    }

    /// The whole list at once, again at a change, and again after [`REPORT_EVERY`] with nothing
    /// changed (the kubelet forgets what is not reported again); the end of the plugin ends it.
    #[tokio::test(start_paused = true)]
    async fn every_device_is_reported_at_start_on_change_and_again_in_time() {
        let (tx, rx) = watch::channel(vec![dev("gpu-0", None), dev("gpu-1", None)]);
        let mut s = std::pin::pin!(due("n1".into(), rx));
        let first = s.next().await.unwrap();
        assert_eq!(first.iter().filter(|r| r.healthy).count(), 2);
        assert_eq!(first[0].pool, "n1");
        tx.send_replace(vec![dev("gpu-0", None), dev("gpu-1", Some(HealthReason::Xid))]);
        let changed = s.next().await.unwrap();
        assert_eq!(
            changed
                .iter()
                .map(|r| (r.device.as_str(), r.healthy))
                .collect::<Vec<_>>(),
            [("gpu-0", true), ("gpu-1", false)]
        );
        assert_eq!(changed[1].message, "Xid: the driver reported XID 79");
        let started = tokio::time::Instant::now();
        let again = s.next().await.unwrap();
        assert_eq!(again, changed);
        assert!(started.elapsed() >= REPORT_EVERY);
        drop(tx);
        assert!(s.next().await.is_none());
    }
}
