//! Real processes of the product for scenarios: `gpu-tenancy agent run` on simulated GPUs of its
//! own, and `gpu-tenancy controller` replicas; both can be killed (SIGKILL, as a node or pod
//! crash) and started again.

use crate::{Cleanup, kubeconfig_path, repo_root};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

fn binary(name: &str) -> PathBuf {
    let bin = repo_root().join("target/debug").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p gpu-tenancy -p nvml-sim` (e2e/run.sh does)",
        bin.display()
    );
    bin
}

/// A real `gpu-tenancy agent run` for Node `name` (labelled `pool=<pool>`) with simulated GPUs of
/// its own (a `gpus:` YAML list, as in nvml-sim's config); its simulator state outlives a kill, as
/// a node's GPUs outlive its agent. The agent and the state go when dropped.
pub struct SimAgent {
    pub name: String,
    dir: PathBuf,
    agent: Option<Child>,
}

impl SimAgent {
    /// One simulated H100.
    pub async fn start(client: &Client, cleanup: &Cleanup, name: &str, pool: &str) -> SimAgent {
        Self::start_with(
            client,
            cleanup,
            name,
            pool,
            "- {pciDeviceId: \"0x233010DE\", count: 1}\n",
        )
        .await
    }

    /// `gpus` is the YAML list of nvml-sim's config.
    pub async fn start_with(client: &Client, cleanup: &Cleanup, name: &str, pool: &str, gpus: &str) -> SimAgent {
        let dir = std::env::temp_dir().join(format!("gt-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sim.yaml"), format!("gpus:\n{gpus}")).unwrap();
        cleanup.add_resource("nodes", name);
        cleanup.add("GpuNode", name);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": pool}}})).unwrap();
        let _ = Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await;
        let mut agent = SimAgent {
            name: name.to_string(),
            dir,
            agent: None,
        };
        agent.restart();
        agent
    }

    /// Starts the agent process again (after [`SimAgent::kill`]); a running one is killed first.
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new(binary("gpu-tenancy"));
        cmd.args(["agent", "run", "--node-name", &self.name, "--poll", "1"])
            .env("KUBECONFIG", kubeconfig_path())
            .env("RUST_LOG", "warn");
        sim_env(&self.dir, &mut cmd);
        self.agent = Some(cmd.spawn().expect("the agent starts"));
    }

    /// SIGKILL, as a crash: no cleanup, whatever it was doing stops mid-way.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.agent.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Runs `sim-ctl ARGS` on this agent's simulated GPUs; returns its output.
    pub fn sim_ctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(binary("sim-ctl"));
        cmd.args(args);
        sim_env(&self.dir, &mut cmd);
        let out = cmd.output().expect("sim-ctl runs");
        assert!(
            out.status.success(),
            "sim-ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// NVML mutations made on this node's GPUs so far (the simulator's own count).
    pub fn mutations(&self) -> u64 {
        let state: serde_json::Value = serde_json::from_str(&self.sim_ctl(&["state"])).expect("sim-ctl state is JSON");
        state["mutations"].as_u64().unwrap_or(0)
    }

    /// The mutations after number `since`, as the simulator logged them (`call gpu detail`).
    pub fn log_since(&self, since: u64) -> Vec<String> {
        self.sim_ctl(&["log", "--since", &since.to_string()])
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|e| {
                format!(
                    "{} gpu {} {}",
                    e["call"].as_str().unwrap_or("?"),
                    e["gpu"],
                    e["detail"].as_str().unwrap_or("")
                )
            })
            .collect()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.kill();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn sim_env(dir: &Path, cmd: &mut Command) {
    let lib = repo_root().join("target/debug/libnvidia_ml_sim.so");
    cmd.env("GPU_TENANCY_SIM_CONFIG", dir.join("sim.yaml"))
        .env("GPU_TENANCY_SIM_STATE", dir.join("sim.state.json"))
        .env("GPU_TENANCY_NVML_LIB", &lib)
        .env("GPU_TENANCY_CUDA_LIB", &lib);
}

/// A `gpu-tenancy controller` replica, leader-elected on the Lease `gpu-tenancy-controller` in
/// `gpu-tenancy-system`; killed when dropped.
pub struct ControllerProcess {
    pub identity: String,
    lease_seconds: u32,
    child: Option<Child>,
}

impl ControllerProcess {
    pub fn start(identity: &str, lease_seconds: u32) -> ControllerProcess {
        let mut c = ControllerProcess {
            identity: identity.to_string(),
            lease_seconds,
            child: None,
        };
        c.restart();
        c
    }

    /// Starts the process again (after a kill); a running one is killed first.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(binary("gpu-tenancy"))
            .args([
                "controller",
                "--metrics-addr",
                "127.0.0.1:0",
                "--lease-duration",
                &self.lease_seconds.to_string(),
                "--identity",
                &self.identity,
            ])
            .env("KUBECONFIG", kubeconfig_path())
            .env("POD_NAMESPACE", "gpu-tenancy-system")
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("the controller starts");
        self.child = Some(child);
    }

    /// SIGKILL: the lease is not released; a follower waits for it to expire.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as Kubernetes stops a pod: the process releases its lease and exits.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The identity holding the controller's Lease, if any.
pub async fn lease_holder(client: &Client) -> Option<String> {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), "gpu-tenancy-system")
        .get_opt("gpu-tenancy-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}
