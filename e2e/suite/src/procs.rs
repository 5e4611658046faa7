//! Real processes of the product for scenarios: `gpu-tenancy agent run` on simulated GPUs of its
//! own, and `gpu-tenancy controller` replicas; both can be killed (SIGKILL, as a node or pod
//! crash) and started again. The controller scenarios (tests/controller) and the fault scenarios
//! (tests/faults) both run them from here, so every scenario starts them with the same arguments
//! and environment.

use crate::{Cleanup, kubeconfig_path, repo_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// `GET path` on `addr` over plain HTTP/1.1: (status code, body); `None` while nothing listens.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// The namespace of the controller's Lease (its `POD_NAMESPACE`).
pub const CONTROLLER_NAMESPACE: &str = "gpu-tenancy-system";
/// The Lease the controller replicas elect their leader on.
pub const CONTROLLER_LEASE: &str = "gpu-tenancy-controller";

fn binary(name: &str) -> PathBuf {
    let bin = repo_root().join("target/debug").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p gpu-tenancy -p nvml-sim` (e2e/run.sh does)",
        bin.display()
    );
    bin
}

/// A real `gpu-tenancy agent run` for Node `name` (labelled `pool=<pool>`) with simulated H100s
/// of its own; `sim_ctl` drives them. Its simulator state outlives a kill, as a node's GPUs
/// outlive its agent. The agent and the state go when dropped.
pub struct SimAgent {
    pub name: String,
    dir: PathBuf,
    agent: Option<Child>,
    /// Arguments of `agent run` beyond the node name and poll (the DRA mode's).
    args: Vec<String>,
    /// Environment of the next start (a test hook of the DRA mode, say).
    pub env: Vec<(String, String)>,
    /// `--poll` of the next start, in seconds (1 unless a test sets it).
    pub poll: u64,
    /// `--pod-resources-socket` when not the one under [`SimAgent::dir`] (a real kubelet's).
    pod_resources: Option<PathBuf>,
}

impl SimAgent {
    /// An agent on one simulated H100.
    pub async fn start(client: &Client, cleanup: &Cleanup, name: &str, pool: &str) -> SimAgent {
        Self::start_with(client, cleanup, name, pool, 1).await
    }

    /// An agent on `h100s` simulated H100s (indices 0..h100s).
    pub async fn start_with(client: &Client, cleanup: &Cleanup, name: &str, pool: &str, h100s: u32) -> SimAgent {
        let config = format!("gpus:\n- {{pciDeviceId: \"0x233010DE\", count: {h100s}}}\n");
        Self::start_config(client, cleanup, name, pool, &config).await
    }

    /// An agent on the simulated GPUs of `config` (the simulator's `sim.yaml`).
    pub async fn start_config(client: &Client, cleanup: &Cleanup, name: &str, pool: &str, config: &str) -> SimAgent {
        Self::start_polling(client, cleanup, name, pool, config, 1).await
    }

    /// [`SimAgent::start_config`] with `--poll` of `poll` seconds from its first start.
    pub async fn start_polling(
        client: &Client,
        cleanup: &Cleanup,
        name: &str,
        pool: &str,
        config: &str,
        poll: u64,
    ) -> SimAgent {
        let dir = std::env::temp_dir().join(format!("gt-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join("sim.yaml"), config)
            .unwrap_or_else(|e| panic!("writing {}/sim.yaml: {e}", dir.display()));
        cleanup.add_resource("nodes", name);
        cleanup.add("GpuNode", name);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": pool}}}))
            .expect("a Node with a name and labels");
        // The Node may be left from an earlier run on this cluster: a 409 keeps it.
        let _ = Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await;
        let mut agent = SimAgent {
            name: name.to_string(),
            dir,
            agent: None,
            args: vec![],
            env: vec![],
            poll,
            pod_resources: None,
        };
        agent.restart();
        agent
    }

    /// An agent in DRA mode on `h100s` simulated H100s: its kubelet sockets, checkpoint, CDI
    /// specs, MPS pipes and the driver's `mig-minors` (as the simulator numbers instances) all
    /// under [`SimAgent::dir`].
    pub async fn start_dra(client: &Client, cleanup: &Cleanup, name: &str, pool: &str, h100s: u32) -> SimAgent {
        let config = format!("gpus:\n- {{pciDeviceId: \"0x233010DE\", count: {h100s}}}\n");
        Self::start_dra_config(client, cleanup, name, pool, &config, h100s).await
    }

    /// An agent in DRA mode on the `gpus` simulated GPUs of `config`.
    pub async fn start_dra_config(
        client: &Client,
        cleanup: &Cleanup,
        name: &str,
        pool: &str,
        config: &str,
        gpus: u32,
    ) -> SimAgent {
        let h100s = gpus;
        let mut a = Self::start_config(client, cleanup, name, pool, config).await;
        a.kill();
        let d = a.dir.clone();
        // gpu<minor>/gi<id>/access and .../ci0/access for every GPU instance ID a driver hands out.
        let mut minors = String::from("config 1\nmonitor 2\n");
        let mut n = 3;
        for gpu in 0..h100s {
            for gi in 0..15 {
                minors.push_str(&format!(
                    "gpu{gpu}/gi{gi}/access {n}\ngpu{gpu}/gi{gi}/ci0/access {}\n",
                    n + 1
                ));
                n += 2;
            }
        }
        std::fs::write(d.join("mig-minors"), minors).expect("writing mig-minors");
        let path = |p: &str| d.join(p).display().to_string();
        a.args = vec![
            "--mode".into(),
            "dra".into(),
            "--kubelet-registry-dir".into(),
            path("plugins_registry"),
            "--kubelet-plugins-dir".into(),
            path("plugins"),
            "--state-dir".into(),
            path("state"),
            "--cdi-dir".into(),
            path("cdi"),
            "--mig-minors-file".into(),
            path("mig-minors"),
            "--mps-pipe-dir".into(),
            path("mps-pipe"),
            "--mps-log-dir".into(),
            path("mps-log"),
            // The memory caps' probe looks at the simulated node, not this machine: no toolkit
            // and no cgroup v2 there until a test offers them ([`SimAgent::offer_driver_caps`]).
            "--host-root".into(),
            path("host"),
            "--cgroup-root".into(),
            path("cgroup"),
        ];
        a.restart();
        a
    }

    /// Gives the simulated node what the driver's memory cap needs beside the driver's version
    /// (the simulator's `driverVersion`): a container toolkit that says it is 1.20.1 at
    /// `/usr/bin/nvidia-ctk` under `--host-root`, and cgroup v2 under `--cgroup-root`. The agent's
    /// next pass finds them.
    pub fn offer_driver_caps(&self) {
        use std::os::unix::fs::PermissionsExt;
        let ctk = self.dir.join("host/usr/bin/nvidia-ctk");
        std::fs::create_dir_all(ctk.parent().expect("a parent")).expect("creating the host's /usr/bin");
        std::fs::write(&ctk, "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.20.1'\n")
            .expect("writing nvidia-ctk");
        std::fs::set_permissions(&ctk, std::fs::Permissions::from_mode(0o755)).expect("making nvidia-ctk executable");
        std::fs::create_dir_all(self.dir.join("cgroup")).expect("creating the cgroup root");
        std::fs::write(self.dir.join("cgroup/cgroup.controllers"), "cpu memory pids\n")
            .expect("writing cgroup.controllers");
    }

    /// Restarts the agent as the DRA plugin of a real kubelet: its sockets in the kubelet's
    /// `registry` and `plugins` directories, its CDI specs in the runtime's `cdi` directory.
    pub fn serve_kubelet(&mut self, registry: &Path, plugins: &Path, cdi: &Path) {
        for (flag, value) in [
            ("--kubelet-registry-dir", registry),
            ("--kubelet-plugins-dir", plugins),
            ("--cdi-dir", cdi),
        ] {
            let i = self
                .args
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("agent {} runs without {flag}: not in DRA mode", self.name));
            self.args[i + 1] = value.display().to_string();
        }
        self.restart();
    }

    /// Restarts the agent serving its metrics on a free port of 127.0.0.1; the address.
    pub fn serve_metrics(&mut self) -> std::net::SocketAddr {
        // The port is free now; nothing else on this machine takes ports at random meanwhile.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        self.args.extend(["--metrics-addr".into(), addr.to_string()]);
        self.restart();
        addr
    }

    /// The directory of this agent's simulated node (sockets, state, CDI specs in DRA mode).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where this agent reads the kubelet's pod-resources API (under [`SimAgent::dir`], never the
    /// host's kubelet): absent unless a test serves it
    /// ([`crate::kubelet::pod_resources::PodResourcesServer`]), or a real kubelet's
    /// ([`SimAgent::read_kubelet`]).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.pod_resources
            .clone()
            .unwrap_or_else(|| self.dir.join("pod-resources/kubelet.sock"))
    }

    /// Restarts the agent reading the pod-resources API of a real kubelet on `socket`
    /// ([`crate::node::RealNode::pod_resources_socket`]).
    pub fn read_kubelet(&mut self, socket: &Path) {
        self.pod_resources = Some(socket.to_path_buf());
        self.restart();
    }

    /// The agent's `--proc-root` (under [`SimAgent::dir`], never this machine's `/proc`: the
    /// simulated PIDs are no processes here). Empty unless a test writes processes into it
    /// ([`SimAgent::fake_process`]).
    pub fn proc_root(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// Makes PID `pid` a process in the agent's `--proc-root` whose `/proc/<pid>/cgroup` reads
    /// `cgroup`, as the kernel would show a container's (or a host process's) to the agent.
    pub fn fake_process(&self, pid: u32, cgroup: &str) {
        let dir = self.proc_root().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join("cgroup"), cgroup).unwrap_or_else(|e| panic!("writing {}/cgroup: {e}", dir.display()));
    }

    /// Starts the agent again on the same simulated GPUs and state (killing it first if it
    /// runs), as its DaemonSet would after a crash.
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new(binary("gpu-tenancy"));
        let pod_resources = self.pod_resources_socket();
        cmd.args([
            "agent",
            "run",
            "--node-name",
            &self.name,
            "--poll",
            &self.poll.to_string(),
        ])
        .arg("--pod-resources-socket")
        .arg(&pod_resources)
        .arg("--proc-root")
        .arg(self.proc_root())
        .args(&self.args)
        .env("RUST_LOG", "warn")
        // A test's own settings (RUST_LOG among them) come after the defaults.
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", kubeconfig_path());
        sim_env(&self.dir, &mut cmd);
        self.agent = Some(cmd.spawn().expect("the agent starts"));
    }

    /// SIGTERM, as the kubelet stops a pod: the agent's clean stop. Its exit status (None if it
    /// was not running or is still running after `timeout`).
    pub async fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let pid = self.agent.as_ref()?.id();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        self.exited(timeout).await
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

    /// Waits up to `timeout` for the agent to exit on its own (an injected abort); its exit
    /// status, or None if it still runs (or was never started again after a kill).
    pub async fn exited(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let child = self.agent.as_mut()?;
            if let Some(status) = child.try_wait().expect("waiting on the agent process") {
                return Some(status);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets the agent's `flag` to `value`: the one it has replaced (a flag given twice stops the
    /// agent), else added. Takes effect at the next restart.
    fn set_arg(&mut self, flag: &str, value: &str) {
        match self.args.iter().position(|a| a == flag) {
            Some(i) => self.args[i + 1] = value.to_string(),
            None => self.args.extend([flag.to_string(), value.to_string()]),
        }
    }

    /// Restarts the agent with `--nvidia-ctk` naming the simulator's stand-in for the container
    /// toolkit (`sim-nvidia-ctk`, reporting toolkit `version`), through a wrapper script under
    /// [`SimAgent::dir`] that points it at this node's simulated GPUs: the container runtime runs
    /// it as the memory cap's hook with the hook's environment, not the test's. Its
    /// `--cgroup-root` is a cgroup v2 root under [`SimAgent::dir`], whatever this machine mounts.
    /// The wrapper's path.
    pub fn use_nvidia_ctk(&mut self, version: &str) -> PathBuf {
        let cgroup = self.dir.join("cgroup");
        std::fs::create_dir_all(&cgroup).unwrap_or_else(|e| panic!("creating {}: {e}", cgroup.display()));
        std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory pids\n")
            .unwrap_or_else(|e| panic!("writing {}/cgroup.controllers: {e}", cgroup.display()));
        self.set_arg("--cgroup-root", &cgroup.display().to_string());
        // The wrapper is a path of this machine, not of the simulated node's host root.
        self.set_arg("--host-root", "/");
        let wrapper = self.dir.join("nvidia-ctk");
        let script = format!(
            "#!/bin/sh\nexport GPU_TENANCY_SIM_CONFIG='{}' GPU_TENANCY_SIM_STATE='{}' GPU_TENANCY_SIM_CTK_VERSION='{version}'\nexec '{}' \"$@\"\n",
            self.dir.join("sim.yaml").display(),
            self.dir.join("sim.state.json").display(),
            binary("sim-nvidia-ctk").display(),
        );
        std::fs::write(&wrapper, script).unwrap_or_else(|e| panic!("writing {}: {e}", wrapper.display()));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("making {} executable: {e}", wrapper.display()));
        self.set_arg("--nvidia-ctk", &wrapper.display().to_string());
        self.restart();
        wrapper
    }

    /// Runs `sim-ctl ARGS` on this agent's simulated GPUs, whatever its exit status.
    pub fn sim_ctl_output(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(binary("sim-ctl"));
        cmd.args(args);
        sim_env(&self.dir, &mut cmd);
        cmd.output().expect("sim-ctl runs")
    }

    /// Runs `sim-ctl ARGS` on this agent's simulated GPUs; its standard output.
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

    /// The simulator's whole state (`sim-ctl state`): GPUs, instances, `mutations`, `scrubs`...
    pub fn sim_state(&self) -> Value {
        serde_json::from_str(&self.sim_ctl(&["state"])).expect("sim-ctl state prints JSON")
    }

    /// NVML mutations made on this node's GPUs so far (the simulator's own count).
    pub fn mutations(&self) -> u64 {
        let state = self.sim_state();
        state["mutations"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: sim-ctl state has no mutations count: {state}", self.name))
    }

    /// The simulator's NVML mutation log after mutation number `since` (`sim-ctl log`), one
    /// JSON object per mutation (`call`, `gpu`, `detail`...).
    pub fn sim_log(&self, since: u64) -> Vec<Value> {
        self.sim_ctl(&["log", "--since", &since.to_string()])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("sim-ctl log printed {l:?}: {e}")))
            .collect()
    }

    /// [`SimAgent::sim_log`] for people: `call gpu N detail` per mutation.
    pub fn log_since(&self, since: u64) -> Vec<String> {
        self.sim_log(since)
            .iter()
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

/// The simulated NVML (and CUDA, for scrubs) library, on the GPUs and state in `dir`.
fn sim_env(dir: &Path, cmd: &mut Command) {
    let lib = repo_root().join("target/debug/libnvidia_ml_sim.so");
    cmd.env("GPU_TENANCY_SIM_CONFIG", dir.join("sim.yaml"))
        .env("GPU_TENANCY_SIM_STATE", dir.join("sim.state.json"))
        .env("GPU_TENANCY_NVML_LIB", &lib)
        .env("GPU_TENANCY_CUDA_LIB", &lib);
}

/// A `gpu-tenancy controller` replica, leader-elected on the Lease [`CONTROLLER_LEASE`] in
/// [`CONTROLLER_NAMESPACE`]; killed when dropped.
pub struct ControllerProcess {
    pub identity: String,
    lease_seconds: u32,
    kubeconfig: PathBuf,
    /// More flags of `gpu-tenancy controller`.
    args: Vec<String>,
    child: Option<Child>,
}

impl ControllerProcess {
    /// A replica with the cluster's admin kubeconfig.
    pub fn start(identity: &str, lease_seconds: u32) -> ControllerProcess {
        Self::start_with_kubeconfig(identity, lease_seconds, kubeconfig_path())
    }

    /// A replica reading `kubeconfig` (one that impersonates its service account, say).
    pub fn start_with_kubeconfig(identity: &str, lease_seconds: u32, kubeconfig: PathBuf) -> ControllerProcess {
        let mut c = ControllerProcess {
            identity: identity.to_string(),
            lease_seconds,
            kubeconfig,
            args: Vec::new(),
            child: None,
        };
        c.restart();
        c
    }

    /// A replica with the cluster's admin kubeconfig and more flags, `args`.
    pub fn start_with_args(identity: &str, lease_seconds: u32, args: &[&str]) -> ControllerProcess {
        let mut c = ControllerProcess {
            identity: identity.to_string(),
            lease_seconds,
            kubeconfig: kubeconfig_path(),
            args: args.iter().map(|a| a.to_string()).collect(),
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
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAMESPACE", CONTROLLER_NAMESPACE)
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

    /// SIGTERM, as Kubernetes stops a pod: the process releases its lease and exits. Its exit
    /// status (None if it was not running).
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        Some(c.wait().expect("waiting on the controller process"))
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The process's resident memory (VmRSS), 0 when it does not run.
    pub fn rss_kib(&self) -> u64 {
        let Some(pid) = self.pid() else { return 0 };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The controller's Lease, if it exists (and the API server answers).
pub async fn controller_lease(client: &Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), CONTROLLER_NAMESPACE)
        .get_opt(CONTROLLER_LEASE)
        .await
        .ok()
        .flatten()
}

/// The identity holding the controller's Lease, if any.
pub async fn lease_holder(client: &Client) -> Option<String> {
    controller_lease(client).await?.spec?.holder_identity
}

/// Waits until `identity` holds the controller's Lease; fails the test after `within`.
pub async fn wait_for_leader(client: &Client, identity: &str, within: Duration) {
    let t0 = std::time::Instant::now();
    while lease_holder(client).await.as_deref() != Some(identity) {
        assert!(
            t0.elapsed() < within,
            "{identity} did not hold the Lease {CONTROLLER_NAMESPACE}/{CONTROLLER_LEASE} within {within:?} (holder: {:?})",
            lease_holder(client).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
