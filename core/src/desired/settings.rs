//! What the controller is told (its flags, as [`Settings`]) and how it marks what it creates
//! ([`managed_labels`]): read by every part of the desired state, reading none of it.

use std::collections::{BTreeMap, BTreeSet};

/// Where the objects that are not per tenant go, and what the admission policies leave alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Namespace of NVIDIA's device plugin, where its config ConfigMap lives (exempt: the plugin
    /// and its MPS daemon are privileged).
    pub device_plugin_namespace: String,
    /// Name of the device plugin's config ConfigMap (the plugin's `config.name`).
    pub device_plugin_config_map: String,
    /// This operator's namespace (exempt: its agents are privileged).
    pub operator_namespace: String,
    /// More namespaces whose pods the admission policies never judge: the cluster's own and the
    /// platform's node-level components (a privileged CSI driver, node-exporter's host mounts).
    pub exempt_namespaces: Vec<String>,
    /// DeviceClasses of other drivers whose ResourceClaims every namespace may make, beside each
    /// tenant's own classes (`dra`). Every other class is refused: a class's name does not say
    /// which devices its selectors reach, so none is trusted unless named.
    pub claim_device_classes: Vec<String>,
    /// RuntimeClasses that run NVIDIA's container runtime: a pod that asks for no GPU may not use
    /// them (the runtime would honour an image's `NVIDIA_VISIBLE_DEVICES=all`).
    pub nvidia_runtime_classes: Vec<String>,
    /// Extended resources under a GPU prefix (`nvidia.com/`) that are not GPUs (a NIC's, say):
    /// not refused by the allow-list of granted GPU resources.
    pub allowed_resources: Vec<String>,
    /// Namespaces whose pods may mount the node's hand-over files (CDI specs, the agents' state,
    /// NVIDIA's toolkit configuration, `/proc`), beside this operator's and the device plugin's:
    /// node components that run privileged anyway (the cluster's own, a CNI that mounts `/proc`).
    /// Every other namespace is refused.
    pub node_file_namespaces: Vec<String>,
    /// The container runtime's CDI spec directories (its `cdi_spec_dirs`).
    pub cdi_spec_dirs: Vec<String>,
    /// The agents' state directories (their `--state-dir`: the DRA checkpoint and its key).
    pub agent_state_dirs: Vec<String>,
    /// Kueue's CRDs are served: the controller writes each tenant's queues
    /// (docs/concepts/queues.md), and a namespace's quota is a ceiling at the tenant's whole
    /// grant rather than its even share. The controller finds it by discovery at start; `plan`
    /// is told by `--kueue`.
    pub kueue: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            device_plugin_namespace: "nvidia-device-plugin".into(),
            device_plugin_config_map: "gpu-tenancy-device-plugin-configs".into(),
            operator_namespace: "gpu-tenancy-system".into(),
            exempt_namespaces: vec!["kube-system".into(), "kube-public".into(), "kube-node-lease".into()],
            claim_device_classes: vec![],
            nvidia_runtime_classes: vec!["nvidia".into(), "nvidia-cdi".into(), "nvidia-legacy".into()],
            allowed_resources: vec![],
            node_file_namespaces: vec!["kube-system".into()],
            cdi_spec_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
            agent_state_dirs: vec!["/var/lib/gpu-tenancy".into()],
            kueue: false,
        }
    }
}

impl Settings {
    /// Every namespace the admission policies never judge.
    pub fn exempt(&self) -> BTreeSet<String> {
        self.exempt_namespaces
            .iter()
            .chain([&self.device_plugin_namespace, &self.operator_namespace])
            .cloned()
            .collect()
    }

    /// The namespaces whose pods may mount the node's hand-over files: this operator's, the
    /// device plugin's (NVIDIA's plugin mounts the driver root, `/` by default) and those named.
    pub fn node_file_trusted(&self) -> BTreeSet<String> {
        self.node_file_namespaces
            .iter()
            .chain([&self.device_plugin_namespace, &self.operator_namespace])
            .cloned()
            .collect()
    }
}

/// Labels on every object this operator creates, so the controller finds what it owns.
pub(crate) fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        crate::labels::MANAGED_BY.to_string(),
        crate::labels::MANAGED_BY_VALUE.to_string(),
    )])
}
