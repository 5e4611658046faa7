//! A real node: Kubernetes' own kubelet (e2e/kubelet, built from `cmd/kubelet` at the control
//! plane's version) on a CRI runtime that runs no containers but resolves their CDI devices as
//! containerd does (`e2e/bin/kubelet runtime`). The kubelet registers its Node, watches its plugin
//! registry, calls the DRA plugins' Prepare and Unprepare, and starts the pods bound to it. With
//! [`RealNode::start_device_plugin`] its device manager also has a device plugin advertising what
//! NVIDIA's would for the node's config (`e2e/bin/kubelet device-plugin`), and its pod-resources
//! server ([`RealNode::pod_resources_socket`]) says which pod holds which of those devices.
//!
//! The kubelet's device manager serves `/var/lib/kubelet/device-plugins/kubelet.sock` whatever
//! its `--root-dir`, and empties that directory when it starts: each kubelet runs in a mount
//! namespace of its own where that path is its node's `root/device-plugins/`
//! ([`RealNode::device_plugin_dir`]), so kubelets of one machine (tests in parallel, other suites)
//! keep their own plugins. Needs `unshare` and root, as the kubelet does.
//!
//! Settings for these machines (cgroup v1, no swap accounting, no image filesystem): no QoS
//! cgroups, no node-allocatable enforcement, no eviction thresholds, no read-only or healthz port,
//! the API on 127.0.0.1. The node lifecycle controller does not run in the test control plane, so
//! [`RealNode::start`] lifts the `node.kubernetes.io/not-ready` taint once the Node is Ready, as
//! that controller would.

use crate::{Cleanup, repo_root};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One kubelet and its runtime, killed when dropped.
pub struct RealNode {
    pub name: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    labels: String,
    runtime: Option<Child>,
    kubelet: Option<Child>,
    device_plugin: Option<Child>,
}

/// The devices of a node as NVIDIA's device plugin finds them through NVML: whole GPUs, GPUs with
/// MIG mode on, and MIG devices with their profiles.
#[derive(Clone, Debug, Default)]
pub struct NodeDevices {
    /// UUIDs (`GPU-...`) of the GPUs without MIG mode.
    pub gpus: Vec<String>,
    /// UUIDs of the GPUs with MIG mode on.
    pub mig_gpus: Vec<String>,
    /// MIG devices: UUID (`MIG-...`) and profile (`3g.40gb`).
    pub mig_devices: Vec<(String, String)>,
}

/// Where the kubelet's device manager serves and looks for device plugins, whatever its root
/// directory (`pluginapi.KubeletSocket`, fixed in k8s.io/kubelet's deviceplugin/v1beta1).
const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";

/// A command that runs the program given next in a mount namespace of its own where
/// [`DEVICE_PLUGIN_PATH`] is `dir`: the device manager ignores `--root-dir` and empties that
/// directory at start, so kubelets sharing a machine would take each other's plugins. Mounts the
/// kubelet makes (pod volumes) stay in that namespace and go with it.
fn in_own_device_plugin_dir(dir: &Path) -> Command {
    std::fs::create_dir_all(dir).expect("creating the kubelet's device-plugin directory");
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mkdir -p {DEVICE_PLUGIN_PATH} && mount --bind \"$0\" {DEVICE_PLUGIN_PATH} && exec \"$@\""
        ))
        .arg(dir);
    c
}

fn bin() -> PathBuf {
    let b = repo_root().join("e2e/bin/kubelet");
    assert!(b.is_file(), "{} is missing: e2e/run.sh build builds it", b.display());
    b
}

impl RealNode {
    /// Starts the runtime and the kubelet of node `name` with `labels` (`k=v,...`), and waits
    /// until its Node is Ready.
    pub async fn start(client: &Client, cleanup: &Cleanup, name: &str, labels: &str) -> RealNode {
        let dir = std::env::temp_dir().join(format!("gt-kubelet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["root", "cdi", "logs", "pki"] {
            std::fs::create_dir_all(dir.join(d)).expect("creating the kubelet's directories");
        }
        cleanup.add_resource("nodes", name);
        let kubeconfig = PathBuf::from(
            std::env::var("GPU_TENANCY_E2E_KUBECONFIG").expect("GPU_TENANCY_E2E_KUBECONFIG names the test cluster"),
        );
        let mut node = RealNode {
            name: name.into(),
            dir,
            kubeconfig,
            labels: labels.into(),
            runtime: None,
            kubelet: None,
            device_plugin: None,
        };
        node.start_runtime();
        node.start_kubelet();
        node.ready(client).await;
        node
    }

    /// The kubelet's plugin registry directory (`plugins_registry/`).
    pub fn registry_dir(&self) -> PathBuf {
        self.dir.join("root/plugins_registry")
    }

    /// The kubelet's plugins directory (`plugins/`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.join("root/plugins")
    }

    /// The kubelet's device-plugin directory (`device-plugins/`: its registration socket and the
    /// plugins' sockets).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.join("root/device-plugins")
    }

    /// The kubelet's pod-resources socket (`pod-resources/kubelet.sock`), for the agent's
    /// `--pod-resources-socket`.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.join("root/pod-resources/kubelet.sock")
    }

    /// Starts (again: a running one is stopped first, as NVIDIA's plugin is restarted to read its
    /// devices again) the device plugin for NVIDIA's plugin config `config` (YAML, as the
    /// controller renders it for this node) on `devices`, and waits until the kubelet's Node
    /// has the `want` resources allocatable (name and count; other resource names none).
    pub async fn start_device_plugin(
        &mut self,
        client: &Client,
        config: &str,
        devices: &NodeDevices,
        want: &[(&str, u64)],
    ) {
        self.stop_device_plugin();
        let file = self.dir.join("device-plugin.yaml");
        std::fs::write(&file, config).expect("writing the device plugin's config");
        let log = std::fs::File::create(self.dir.join("device-plugin.log")).expect("the device plugin's log");
        let mig: Vec<String> = devices.mig_devices.iter().map(|(u, p)| format!("{u}={p}")).collect();
        let child = Command::new(bin())
            .current_dir(&self.dir)
            .arg("device-plugin")
            .arg("--plugin-dir")
            .arg(self.device_plugin_dir())
            .arg("--config")
            .arg(&file)
            .args(["--gpus", &devices.gpus.join(",")])
            .args(["--mig-gpus", &devices.mig_gpus.join(",")])
            .args(["--mig-devices", &mig.join(",")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the device plugin starts");
        self.device_plugin = Some(child);
        self.allocatable(client, want).await;
    }

    /// Stops the device plugin (SIGKILL); the kubelet marks its devices unhealthy.
    pub fn stop_device_plugin(&mut self) {
        if let Some(mut c) = self.device_plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The device plugin's log, for a failure's message.
    pub fn device_plugin_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("device-plugin.log")).unwrap_or_default()
    }

    /// Waits until the Node's allocatable GPU resources (`nvidia.com/...`) are `want`.
    async fn allocatable(&self, client: &Client, want: &[(&str, u64)]) {
        let nodes: Api<Node> = Api::all(client.clone());
        let want: std::collections::BTreeMap<String, u64> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let node = nodes.get(&self.name).await.expect("the Node");
            let have: std::collections::BTreeMap<String, u64> = node
                .status
                .and_then(|s| s.allocatable)
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| k.starts_with("nvidia.com/"))
                .map(|(k, q)| (k, q.0.parse().unwrap_or(u64::MAX)))
                .filter(|(_, n)| *n > 0)
                .collect();
            if have == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} has {have:?} allocatable, not {want:?}\nthe device plugin's log:\n{}\nthe kubelet's log:\n{}",
                self.name,
                self.device_plugin_log(),
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The runtime's CDI spec directory.
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    /// Every container the runtime created, in order: its ID, pod, namespace, container, the CDI
    /// devices it was given, the environment their specs set and the `createRuntime` hooks run.
    pub fn containers(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("containers.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("the runtime's record is JSON lines"))
            .collect()
    }

    /// The kubelet's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn start_runtime(&mut self) {
        let log = std::fs::File::create(self.dir.join("runtime.log")).expect("the runtime's log");
        let child = Command::new(bin())
            .current_dir(&self.dir)
            .arg("runtime")
            .arg("--socket")
            .arg(self.dir.join("cri.sock"))
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--record")
            .arg(self.dir.join("containers.jsonl"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the CRI runtime starts");
        self.runtime = Some(child);
    }

    fn start_kubelet(&mut self) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\ncgroupsPerQOS: false\nenforceNodeAllocatable: []\nfailSwapOn: false\ncgroupDriver: cgroupfs\ncontainerRuntimeEndpoint: unix://{}\nauthentication:\n  webhook: {{enabled: false}}\n  anonymous: {{enabled: false}}\nauthorization: {{mode: AlwaysAllow}}\nevictionHard: {{}}\nreadOnlyPort: 0\nhealthzPort: 0\naddress: 127.0.0.1\nport: {port}\npodLogsDir: {}\n",
            self.dir.join("cri.sock").display(),
            self.dir.join("logs").display(),
        );
        std::fs::write(self.dir.join("kubelet.yaml"), config).expect("writing the kubelet's configuration");
        let log = std::fs::File::create(self.dir.join("kubelet.log")).expect("the kubelet's log");
        // Run in the node's own directory: with this runtime the kubelet removes files by paths
        // relative to its working directory (a `Cargo.toml` there went, the suite's own when the
        // kubelet ran in the suite's directory).
        let child = in_own_device_plugin_dir(&self.device_plugin_dir())
            .arg(bin())
            .current_dir(&self.dir)
            .arg("--config")
            .arg(self.dir.join("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--root-dir")
            .arg(self.dir.join("root"))
            .arg("--cert-dir")
            .arg(self.dir.join("pki"))
            .arg("--hostname-override")
            .arg(&self.name)
            .arg("--node-labels")
            .arg(&self.labels)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the kubelet starts");
        self.kubelet = Some(child);
    }

    /// Stops the kubelet (SIGKILL) and starts it again, as after a crash or an upgrade.
    pub async fn restart_kubelet(&mut self, client: &Client) {
        if let Some(mut k) = self.kubelet.take() {
            let _ = k.kill();
            let _ = k.wait();
        }
        self.start_kubelet();
        self.ready(client).await;
    }

    /// A reboot: the kubelet and the runtime stop (every container with them) and start again,
    /// the runtime's CDI directory emptied (a tmpfs) but for the files `keep` names (NVIDIA's
    /// toolkit writes its own spec again at boot). The kubelet's checkpoint survives.
    pub async fn reboot(&mut self, client: &Client, keep: &[&str]) {
        for c in [self.kubelet.take(), self.runtime.take()].into_iter().flatten() {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        for f in std::fs::read_dir(self.cdi_dir()).expect("the CDI directory").flatten() {
            if !keep.iter().any(|k| f.file_name() == *k) {
                std::fs::remove_file(f.path()).expect("emptying the CDI directory");
            }
        }
        self.start_runtime();
        self.start_kubelet();
        self.ready(client).await;
    }

    /// Waits until the Node is Ready, then lifts the not-ready taint.
    async fn ready(&self, client: &Client) {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ready = nodes.get_opt(&self.name).await.ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the kubelet of node {} did not make it Ready:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let node = nodes.get(&self.name).await.expect("the Node");
        let taints: Vec<Value> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != "node.kubernetes.io/not-ready")
            .map(|t| serde_json::to_value(t).expect("a taint serialises"))
            .collect();
        nodes
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .expect("lifting the not-ready taint");
    }

    /// The directory of this node (its kubelet's root, the runtime's socket and record).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        for c in [self.device_plugin.take(), self.kubelet.take(), self.runtime.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        // The kubelet mounts tmpfs for pod volumes under its root: unmounted before removal.
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.join("root"))
            .stderr(Stdio::null())
            .status();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
