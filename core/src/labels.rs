//! Well-known label keys, in one place: those NVIDIA's components set or read, and ours.
//! Each says who writes it and who reads it.

/// GPU model of a node (`NVIDIA-H100-80GB-HBM3`), set by NVIDIA GPU feature discovery. Read by plans'
/// `nodeSelector`s, by the plan checks (the GPU models a selector names, for MIG feasibility) and by
/// `import --from mig-parted` (a `device-filter` becomes a selector on it).
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";

/// `true` on every GPU node, set by GPU feature discovery. Read by plans imported from a mig-parted
/// entry without `device-filter` (they apply to every GPU node).
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";

/// Key of the device-plugin ConfigMap a node uses. Written by the controller (a GpuNode's
/// `devicePluginConfig`, the one source of both); read by the NVIDIA device plugin's
/// config-manager. A name missing from the ConfigMap makes config-manager exit ("specified config
/// ... does not exist", `cmd/config-manager` `updateConfigName`), so the controller writes a label
/// only once the ConfigMap holds its key; with no label it falls back to the `default` key, which
/// the controller writes as a config the plugin refuses (`device_plugin::UNPLANNED`).
pub const DEVICE_PLUGIN_CONFIG: &str = "nvidia.com/device-plugin.config";

/// PCI device IDs of a node's GPUs, for models whose product label is not known here. Read by plans
/// imported from a mig-parted `device-filter` naming such a model.
pub const PCI_DEVICE_ID: &str = "gputenancy.io/pci-device-id";

/// Tenant name, on namespaces (the tenant they belong to). Written by the controller; read by
/// people and selectors. No admission rule is bound to it: anyone who may label a namespace could
/// set it, so the policies are bound to namespace names (`desired::admission`).
pub const TENANT: &str = "gputenancy.io/tenant";

/// The tenant a node's GPUs are all dedicated to (`gpus[].tenants`), as a label and a `NoSchedule`
/// taint. Written by the controller; read by the admission policy (only that tenant may tolerate
/// it) and by that tenant's pods (node selectors, tolerations).
pub const DEDICATED: &str = "gputenancy.io/dedicated";

/// Taint (`NoSchedule`) of a node while its spec hands a GPU or MIG instance to tenants the agent has
/// not yet scrubbed for: the device plugin cannot hide one device, so the node takes no new pods until
/// the hand-over is done. Written by the controller; no tenant may tolerate it (admission).
pub const SCRUB_PENDING: &str = "gputenancy.io/scrub-pending";

/// A node's sharing setting (`MIG`, `MPS`, `TimeSlicing`, `Exclusive`): the device plugin applies one
/// sharing setting per node (k8s-device-plugin#1786). Written by the controller; read by pods that
/// choose an isolation through a node selector, and by people.
pub const SHARING: &str = "gputenancy.io/sharing";

/// The Pod Security Standard the API server enforces in a namespace (Kubernetes' Pod Security
/// admission). Written by the controller on tenant namespaces: the tier's `podSecurity`.
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// The level Pod Security admission warns about (the same as enforced).
pub const POD_SECURITY_WARN: &str = "pod-security.kubernetes.io/warn";
/// The level Pod Security admission records in the audit log (the same as enforced).
pub const POD_SECURITY_AUDIT: &str = "pod-security.kubernetes.io/audit";

/// How pods reach a node's GPUs (`DevicePlugin` or `DRA`, its plan's `deviceAccess`). Written by
/// the controller on planned nodes; read by people and by the install's node selectors (NVIDIA's
/// device plugin and its DRA driver stay off `DRA` nodes: this operator's driver serves them).
pub const DEVICE_ACCESS: &str = "gputenancy.io/device-access";

/// The label Kubernetes puts on every namespace, its name (immutable): what the admission
/// bindings select namespaces by.
pub const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// Marks objects the controller writes (device-plugin ConfigMap, quotas, node labels) so that it
/// updates and prunes only its own; value [`MANAGED_BY_VALUE`]. Read by the controller's writer.
pub const MANAGED_BY: &str = "gputenancy.io/managed-by";

/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "gpu-tenancy";

/// Where a node's reconfiguration stands, like mig-manager's `nvidia.com/mig.config.state`
/// (docs/nvidia.md#the-device-plugin-and-mig-parted). Written by the node agent; read by people and automation waiting for a node.
pub const CONFIG_STATE: &str = "gputenancy.io/config.state";

/// The values of [`CONFIG_STATE`], mig-manager's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigState {
    /// The agent has not applied the current spec yet.
    Pending,
    /// Every GPU matches the spec.
    Success,
    /// The spec cannot be applied (the GpuNode is `Stalled`).
    Failed,
}

impl ConfigState {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigState::Pending => "pending",
            ConfigState::Success => "success",
            ConfigState::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label keys are a DNS subdomain prefix and a name of at most 63 characters.
    #[test]
    fn keys_are_valid_label_keys() {
        for key in [
            GPU_PRODUCT,
            GPU_PRESENT,
            DEVICE_PLUGIN_CONFIG,
            PCI_DEVICE_ID,
            TENANT,
            DEDICATED,
            DEVICE_ACCESS,
            POD_SECURITY_ENFORCE,
            POD_SECURITY_WARN,
            POD_SECURITY_AUDIT,
            SHARING,
            MANAGED_BY,
            CONFIG_STATE,
        ] {
            let (prefix, name) = key.split_once('/').unwrap();
            assert!(prefix.len() <= 253 && prefix.contains('.'), "{key}");
            assert!(!name.is_empty() && name.len() <= 63, "{key}");
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{key}"
            );
        }
        assert!(MANAGED_BY_VALUE.len() <= 63);
    }
}
