//! The policies that judge every namespace outside a trusted set, whichever rule set governs it:
//! ConfigMap and Secret keys named like NVIDIA's device-selecting variables (every namespace that
//! is not exempt), and host paths of the node's hand-over files (every namespace but the
//! operator's, the device plugin's and those `--node-files-namespace` names), and with Kueue on,
//! the queues and priority classes a namespace's workloads name. They need not follow a namespace
//! from one rule set to another.

use super::cel::{self, node_file_paths};
use super::objects::{binding, pod_rules, policy, typed};
use crate::desired::settings::Settings;
use crate::labels::TENANT;
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

/// The policy on Kueue's queue names with Kueue on.
pub const QUEUES_POLICY: &str = "gputenancy.io-queues";

/// With Kueue on, the policy on what names a tenant's queues and its binding, to every namespace
/// that is not exempt. A namespace's tenant is its `gputenancy.io/tenant` label (which only the
/// controller and cluster administrators write; the ClusterQueues select their namespaces by name
/// as well, so a label written by hand on another namespace takes no queue's quota):
/// - a LocalQueue points at its tenant's ClusterQueue, never another tenant's;
/// - an object's `kueue.x-k8s.io/priority-class` label, and a Workload's WorkloadPriorityClass,
///   name the tenant's own class (its priority), never another tenant's, which may be higher.
///
/// A namespace of no tenant names none of this operator's queues or classes. Every kind is
/// matched, since any kind Kueue integrates (Jobs, JobSets, pods, Ray's) carries the label.
pub(super) fn queues(exempt: &BTreeSet<String>) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let prefix = crate::kueue::PREFIX;
    let variables = json!([
        {"name": "tenant", "expression": format!(
            "has(namespaceObject.metadata.labels) && '{TENANT}' in namespaceObject.metadata.labels ? namespaceObject.metadata.labels['{TENANT}'] : ''")},
        {"name": "own", "expression": format!("variables.tenant == '' ? '' : '{prefix}' + variables.tenant")},
    ]);
    // Whether `name` is a queue or class this namespace may name.
    let allowed =
        |name: &str| format!("(variables.tenant == '' ? !{name}.startsWith('{prefix}') : {name} == variables.own)");
    let who = "'namespace ' + namespaceObject.metadata.name + (variables.tenant == '' ? ' (of no GpuTenant)' : ' (GpuTenant ' + variables.tenant + ')')";
    let fix = format!(
        "(variables.tenant == '' ? ', and a namespace of no GpuTenant may name none of them ({prefix}*)' : ': name ' + variables.own + ' or leave it out')"
    );
    let label = "object.metadata.labels['kueue.x-k8s.io/priority-class']";
    let class_ref = "object.spec.priorityClassRef";
    let validations = vec![
        cel::validation_with(
            &format!(
                "request.kind.group == 'kueue.x-k8s.io' && request.kind.kind == 'LocalQueue' && has(object.spec.clusterQueue) && !{}",
                allowed("object.spec.clusterQueue")
            ),
            format!(
                "{who} + ': LocalQueue ' + object.metadata.name + ': spec.clusterQueue ' + object.spec.clusterQueue + ' is not this tenant\\'s ClusterQueue; a LocalQueue may point only at its own tenant\\'s' + {fix}"
            ),
        ),
        cel::validation_with(
            &format!(
                "has(object.metadata.labels) && 'kueue.x-k8s.io/priority-class' in object.metadata.labels && !{}",
                allowed(label)
            ),
            format!(
                "{who} + ': ' + request.kind.kind + ' ' + object.metadata.name + ': label kueue.x-k8s.io/priority-class ' + {label} + ' is not this tenant\\'s WorkloadPriorityClass; a workload may use only its own tenant\\'s priority' + {fix}"
            ),
        ),
        cel::validation_with(
            &format!(
                "request.kind.group == 'kueue.x-k8s.io' && request.kind.kind == 'Workload' && has({class_ref}) && {class_ref}.kind == 'WorkloadPriorityClass' && !{}",
                allowed(&format!("{class_ref}.name"))
            ),
            format!(
                "{who} + ': Workload ' + object.metadata.name + ': spec.priorityClassRef ' + {class_ref}.name + ' is not this tenant\\'s WorkloadPriorityClass; a workload may use only its own tenant\\'s priority' + {fix}"
            ),
        ),
    ];
    let policy = policy(
        QUEUES_POLICY,
        &typed::<Vec<NamedRuleWithOperations>>(json!([{
            "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["*"],
        }])),
        &typed::<Vec<k8s_openapi::api::admissionregistration::v1::Variable>>(variables),
        validations,
        None,
    );
    (policy, binding(QUEUES_POLICY, QUEUES_POLICY, "NotIn", exempt, None))
}
