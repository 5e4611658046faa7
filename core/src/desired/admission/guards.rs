//! The policies that judge every namespace outside a trusted set, whichever rule set governs it:
//! ConfigMap and Secret keys named like NVIDIA's device-selecting variables (every namespace that
//! is not exempt), and host paths of the node's hand-over files (every namespace but the
//! operator's, the device plugin's and those `--node-files-namespace` names). They need not follow
//! a namespace from one rule set to another.

use super::cel::{self, node_file_paths};
use super::objects::{binding, pod_rules, policy, typed};
use crate::desired::settings::Settings;
use k8s_openapi::api::admissionregistration::v1::{
    NamedRuleWithOperations, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::json;
use std::collections::BTreeSet;

/// The policy on ConfigMap and Secret keys in every namespace that is not exempt.
pub const CONFIG_KEYS_POLICY: &str = "gputenancy.io-device-env-keys";
/// The policy on host paths of the node's hand-over files, in every namespace but the trusted.
pub const NODE_FILES_POLICY: &str = "gputenancy.io-node-files";

/// The policy on the node's hand-over files and its binding, to every namespace but the trusted
/// ([`Settings::node_file_trusted`]): exempt namespaces too, since the files decide which GPU a
/// container gets and whether a device is scrubbed before it changes hands.
pub(super) fn node_files(settings: &Settings) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let who = "'namespace ' + namespaceObject.metadata.name";
    let paths = node_file_paths(settings);
    let trusted = settings.node_file_trusted();
    let policy = policy(
        NODE_FILES_POLICY,
        &typed::<Vec<NamedRuleWithOperations>>(pod_rules()),
        &[],
        vec![cel::validation_with(
            &cel::host_path_reaching(&paths),
            format!(
                "{who} + {}",
                cel::text(&format!(
                    ": a hostPath volume may not reach the files that decide which GPU a container gets and whether it is scrubbed first ({}), nor a directory above them, nor name a path with // or /./ (through /proc/<pid>/root every host path is reachable); only the namespaces {} may, the controller's --node-files-namespace names more",
                    paths.join(", "),
                    trusted.iter().cloned().collect::<Vec<_>>().join(", "),
                ))
            ),
        )],
        None,
    );
    (
        policy,
        binding(NODE_FILES_POLICY, NODE_FILES_POLICY, "NotIn", &trusted, None),
    )
}

/// The policy for every guarded namespace, whoever owns it, and its binding: it judges objects
/// other than pods and claims, so it need not follow a namespace from one rule set to another.
pub(super) fn config_keys(exempt: &BTreeSet<String>) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    // The tenant label is shown for what it is, a label (who may label a namespace may write it);
    // the rule itself is the same for every namespace that is not exempt.
    let who = "'namespace ' + namespaceObject.metadata.name + (has(namespaceObject.metadata.labels) && 'gputenancy.io/tenant' in namespaceObject.metadata.labels ? ' (labelled gputenancy.io/tenant=' + namespaceObject.metadata.labels['gputenancy.io/tenant'] + ')' : ' (no GpuTenant label)')";
    let policy = policy(
        CONFIG_KEYS_POLICY,
        &typed::<Vec<NamedRuleWithOperations>>(json!([{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["configmaps", "secrets"],
        }])),
        &[],
        vec![cel::config_key_validation(who)],
        None,
    );
    (
        policy,
        binding(CONFIG_KEYS_POLICY, CONFIG_KEYS_POLICY, "NotIn", exempt, None),
    )
}
