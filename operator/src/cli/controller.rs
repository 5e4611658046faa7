//! `gpu-tenancy controller`: the cluster-side half of the operator (a Deployment, leader-elected).

use super::logging::{self, LogFormat};
use crate::controller::leader::{DEFAULT_LEASE_DURATION, DEFAULT_LEASE_NAME};
use crate::controller::{LeaderOptions, Options, run};
use crate::desired::Settings;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// Address of the HTTP server for Prometheus metrics (`/metrics`) and probes (`/healthz`, `/readyz`).
    #[arg(long, value_name = "ADDR", default_value = crate::controller::DEFAULT_METRICS_ADDR)]
    metrics_addr: SocketAddr,
    /// Log format: `text` for people, `json` for log pipelines. `RUST_LOG` sets the level.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Namespace of the Lease used for leader election (the controller's own namespace).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS", default_value = "gpu-tenancy-system")]
    leader_election_namespace: String,
    /// Name of the Lease.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_LEASE_NAME)]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    identity: Option<String>,
    /// Seconds a leader holds the Lease without renewing it; a crashed leader is replaced within this.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_LEASE_DURATION.as_secs())]
    lease_duration: u64,
    /// Run without leader election: this replica always writes. Only for a single replica.
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of NVIDIA's device plugin, where the controller writes its config ConfigMap.
    #[arg(long, value_name = "NS", default_value_t = Settings::default().device_plugin_namespace)]
    device_plugin_namespace: String,
    /// Name of the device plugin's config ConfigMap (the plugin's `config.name`).
    #[arg(long, value_name = "NAME", default_value_t = Settings::default().device_plugin_config_map)]
    device_plugin_config_map: String,
    /// A namespace the admission policies never judge (repeatable): the cluster's own and the
    /// platform's node-level components (a CSI driver, node-exporter's host mounts). The device
    /// plugin's and the controller's own namespace are always exempt; no tenant may list one.
    #[arg(long = "exempt-namespace", value_name = "NS", default_values_t = Settings::default().exempt_namespaces)]
    exempt_namespaces: Vec<String>,
    /// A DeviceClass of another driver (a NIC's) whose ResourceClaims are admitted in every
    /// namespace (repeatable; none by default). Tenants' own GPU classes need no flag; a class not
    /// named is refused, as its name does not say which devices its selectors reach.
    #[arg(long = "claim-device-class", value_name = "CLASS")]
    claim_device_classes: Vec<String>,
    /// A RuntimeClass that runs NVIDIA's container runtime (repeatable): a pod asking for no GPU
    /// may not use it.
    #[arg(long = "nvidia-runtime-class", value_name = "CLASS", default_values_t = Settings::default().nvidia_runtime_classes)]
    nvidia_runtime_classes: Vec<String>,
    /// An extended resource under nvidia.com/ or gputenancy.io/ that is not a GPU (a NIC's, say):
    /// exempt from the allow-list of granted GPU resources (repeatable).
    #[arg(long = "allowed-resource", value_name = "NAME")]
    allowed_resources: Vec<String>,
    /// A namespace whose pods may mount the node's hand-over files (repeatable): the container
    /// runtime's CDI specs, the agents' state, NVIDIA's toolkit and the runtimes' configuration,
    /// `/proc`. The controller's own and the device plugin's namespace always may; every other
    /// namespace, exempt or not, is refused. Name only namespaces whose pods run privileged anyway.
    #[arg(long = "node-files-namespace", value_name = "NS", default_values_t = Settings::default().node_file_namespaces)]
    node_file_namespaces: Vec<String>,
    /// A directory the container runtime reads CDI specs from (repeatable; its `cdi_spec_dirs`):
    /// no pod outside the trusted namespaces may mount it.
    #[arg(long = "cdi-spec-dir", value_name = "DIR", default_values_t = Settings::default().cdi_spec_dirs,
          value_parser = host_dir)]
    cdi_spec_dirs: Vec<String>,
    /// The agents' `--state-dir` (repeatable): no pod outside the trusted namespaces may mount it.
    #[arg(long = "agent-state-dir", value_name = "DIR", default_values_t = Settings::default().agent_state_dirs,
          value_parser = host_dir)]
    agent_state_dirs: Vec<String>,
    /// Milliseconds of quiet after a change before a pass runs (a burst of changes makes one pass).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    debounce_ms: u64,
    /// Writes of one stage of a pass in flight at once: the controller's share of the API
    /// server's mutating requests in flight (default limit 200, shared by every client).
    #[arg(long, value_name = "N", default_value_t = crate::controller::writer::WRITES_IN_FLIGHT as u32,
          value_parser = clap::value_parser!(u32).range(1..=200))]
    writes_in_flight: u32,
    /// Plan every pass from nothing as well as from the last pass's memo, log both times, and
    /// write the full pass's result wherever the two differ (for benchmarks and for doubt).
    #[arg(long)]
    check_incremental: bool,
    /// Seconds between asking the API server again whether it serves the optional kinds it did not
    /// (Kueue's; one discovery request per kind): once it does, the controller watches them and
    /// writes the queues, no restart.
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    discovery_interval: u64,
}

pub fn run_controller(args: ControllerArgs) -> i32 {
    logging::init(args.log_format, "info");
    crate::runtime::client::with_client(|client| async move {
        let identity = args
            .identity
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("gpu-tenancy-controller-{}", std::process::id()));
        let options = Options {
            settings: Settings {
                device_plugin_namespace: args.device_plugin_namespace,
                device_plugin_config_map: args.device_plugin_config_map,
                operator_namespace: args.leader_election_namespace.clone(),
                exempt_namespaces: args.exempt_namespaces,
                claim_device_classes: args.claim_device_classes,
                nvidia_runtime_classes: args.nvidia_runtime_classes,
                allowed_resources: args.allowed_resources,
                node_file_namespaces: args.node_file_namespaces,
                cdi_spec_dirs: args.cdi_spec_dirs,
                agent_state_dirs: args.agent_state_dirs,
                // Found by discovery, pass by pass (`crate::controller::pass`).
                kueue: false,
            },
            metrics_addr: args.metrics_addr,
            leader: (!args.no_leader_election).then(|| LeaderOptions {
                namespace: args.leader_election_namespace,
                lease_name: args.lease_name,
                identity,
                duration: Duration::from_secs(args.lease_duration),
            }),
            debounce: Duration::from_millis(args.debounce_ms),
            writes_in_flight: args.writes_in_flight as usize,
            check_incremental: args.check_incremental,
            discovery_interval: Duration::from_secs(args.discovery_interval),
        };
        match run(client, options, crate::runtime::client::shutdown_signal()).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                2
            }
        }
    })
}

/// A host directory as the admission policies compare it: absolute, spelled plainly (no `..`, `.`
/// or empty segments), of letters, digits and `-_.`; a trailing slash is dropped.
fn host_dir(s: &str) -> Result<String, HostDirError> {
    let path = s.trim_end_matches('/');
    let plain = path.starts_with('/')
        && path[1..]
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && path.chars().all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c));
    if plain {
        Ok(path.to_string())
    } else {
        Err(HostDirError { given: s.to_string() })
    }
}

/// A host directory flag that is not a plain absolute path.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a plain absolute directory (letters, digits, -, _ and . in segments, no . or .. segments, no //)"
)]
pub struct HostDirError {
    given: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_dirs_are_plain_absolute_paths() {
        assert_eq!(super::host_dir("/var/run/cdi/").as_deref(), Ok("/var/run/cdi"));
        for bad in [
            "var/cdi",
            "/var/../etc",
            "/var//cdi",
            "/var/./cdi",
            "/var/cdi'",
            "/",
            "",
        ] {
            assert!(super::host_dir(bad).is_err(), "{bad}");
        }
    }
}
