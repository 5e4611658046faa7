//! What each rule set refuses. Every refusal names who (the tenant and its tier, or the
//! namespace of no tenant) and the rule broken.
//!
//! Both rule sets refuse the ways to a GPU that bypass the device plugin, so neither quota nor
//! the rules below would see them ([`device_access`]): NVIDIA's device-selecting environment
//! variables, privileged containers, host paths of devices and of the kubelet's plugin sockets,
//! the toolkit's volume-mount device lists, CDI annotations, and NVIDIA's runtime class for a
//! pod that asks for no GPU.
//!
//! A tenant's pods are refused ([`tenant`]) when they:
//! - ask for a GPU resource name the tenant was not granted (an allow-list: a name missing from
//!   the quota would be unlimited) or, if the tenant is not valid, for any; what it was granted
//!   is read from the tenant's `status.admission`, the policy's parameter;
//! - hold more GPUs at once than `limits.maxGpusPerPod`, counted as Kubernetes counts a pod's
//!   effective request (init and sidecar containers included);
//! - tolerate the sharing taint of a mode the tenant holds no shares of (from its status too; MPS
//!   and time-sliced nodes both advertise `nvidia.com/gpu.shared`: the taint is what keeps them apart), the
//!   scrub-pending taint, another tenant's dedicated taint, or every taint;
//! - select another tenant's dedicated nodes, name a node (`spec.nodeName` bypasses the
//!   scheduler and its taints), name a PriorityClass the tier does not list (any, when the tier
//!   is not found or the tenant is not valid: preemption would hand another tenant's devices over
//!   unscrubbed), or mount any host path.
//!
//! One policy holds these rules for every tenant: the tenant, its tier, its grants and its
//! PriorityClasses are read from the parameter each tenant's binding names (the tenant itself).
//!
//! Pods of a namespace of no tenant are refused every GPU resource name, the operator's taints,
//! naming a node, and a required node affinity that would let them onto a GPU node (a mutating
//! policy adds it to every new pod there: [`super::mutation::untenanted`]).
//!
//! Rules on fields an update can still change are judged on updates that change them too:
//! tolerations, annotations, a gated pod's node selector and affinity, and container resources
//! through the `resize` subresource.

use super::cel::{self, Who, validation, validation_with, when};
use crate::api::{GpuTenant, Mode, SharingPolicy, TenantAdmission};
use crate::desired::dra::DraHoldings;
use crate::desired::settings::Settings;
use crate::device_plugin::resource_name;
use crate::labels::{DEDICATED, SCRUB_PENDING, SHARING};
use k8s_openapi::api::admissionregistration::v1::Validation;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// What one tenant's pods may do: from its status (its grants) and its tier.
#[derive(Debug, PartialEq)]
pub struct TenantRules {
    pub name: String,
    /// `None` when the tenant or its tier is not valid: its pods get no GPUs.
    pub granted: Option<Granted>,
}

#[derive(Debug, PartialEq)]
pub struct Granted {
    /// Resource names of the grants with at least one unit: the device plugin's for units on
    /// device-plugin nodes, the tenant's own extended resources for units on DRA nodes.
    pub resources: BTreeSet<String>,
    /// The DeviceClasses of its units on DRA nodes.
    pub classes: BTreeSet<String>,
    /// Device-plugin names whose every unit is on DRA nodes, and the tenant's name for them: its
    /// pods asking by the device plugin's name are served by DRA (`admission::mutation`).
    pub renames: BTreeMap<String, String>,
    /// The shared modes (MPS, TimeSlicing) it holds shares of.
    pub shared_modes: Vec<Mode>,
    /// The PriorityClasses its tier lists.
    pub priority_classes: Vec<String>,
}

impl Granted {
    /// The tenant's `status.admission`: what the tenants' policies read as their parameter.
    pub fn admission(&self) -> TenantAdmission {
        TenantAdmission {
            resource_names: self.resources.iter().cloned().collect(),
            device_classes: self.classes.iter().cloned().collect(),
            shared_modes: self.shared_modes.clone(),
            priority_class_names: self.priority_classes.clone(),
        }
    }
}

impl TenantRules {
    pub fn of(t: &GpuTenant, policies: &[SharingPolicy], dra: &DraHoldings) -> TenantRules {
        let status = t.status.as_ref();
        let valid = t.is_valid();
        let tier = policies
            .iter()
            .find(|p| crate::api::name_of(*p) == t.spec.policy_ref)
            .and_then(|p| p.spec.tier(&t.spec.tier));
        let granted = match (valid, tier) {
            (true, Some(tier)) => {
                let held: Vec<_> = status
                    .map(|s| s.allocation.iter().filter(|a| a.granted > 0).collect())
                    .unwrap_or_default();
                let mut shared_modes: Vec<Mode> = held.iter().map(|a| a.mode).filter(|m| m.is_shared()).collect();
                shared_modes.sort();
                shared_modes.dedup();
                let name = t.name_any();
                let kinds = dra.of_tenant(&name);
                let mut units: BTreeMap<String, u64> = BTreeMap::new();
                for a in &held {
                    *units.entry(resource_name(a.mode, a.profile.as_deref())).or_default() += u64::from(a.granted);
                }
                let renames = units
                    .iter()
                    .filter(|(n, total)| dra.units_named(&name, n) >= **total)
                    .filter_map(|(n, _)| {
                        // One kind per name (a tenant holds MPS or time-slicing shares, not both).
                        let mut of_name = kinds.keys().filter(|k| &k.device_plugin_resource() == n);
                        match (of_name.next(), of_name.next()) {
                            (Some(k), None) => Some((n.clone(), k.extended_resource(&name))),
                            _ => None,
                        }
                    })
                    .collect();
                let resources = units
                    .iter()
                    .filter(|(n, total)| dra.units_named(&name, n) < **total)
                    .map(|(n, _)| n.clone())
                    .chain(kinds.keys().map(|k| k.extended_resource(&name)))
                    .collect();
                Some(Granted {
                    resources,
                    classes: kinds.keys().map(|k| k.class_name(&name)).collect(),
                    renames,
                    shared_modes,
                    priority_classes: tier.priority_class_names.clone(),
                })
            }
            _ => None,
        };
        TenantRules {
            name: t.name_any(),
            granted,
        }
    }
}

/// The CEL expressions that match a pod reaching a GPU around the device plugin's resource names
/// (NVIDIA's device variables, privilege, host device paths, device-list mounts, CDI annotations,
/// NVIDIA's runtime class): the rules both rule sets apply ([`device_access`]). The same for every
/// tenant, so a pass builds them once, not once per tenant.
pub struct BypassExpressions {
    sets_device_env: String,
    sets_limit_env: String,
    privileged: String,
    host_device_path: String,
    mounts_device_list: String,
    cdi_annotation: String,
    /// With the runtime classes' names for the message.
    nvidia_runtime: Option<(String, String)>,
}

impl BypassExpressions {
    pub fn of(settings: &Settings) -> BypassExpressions {
        BypassExpressions {
            sets_device_env: cel::sets_device_env(),
            sets_limit_env: cel::sets_limit_env(),
            privileged: cel::privileged(),
            host_device_path: cel::host_device_path(),
            mounts_device_list: cel::mounts_device_list(),
            cdi_annotation: cel::cdi_annotation(),
            nvidia_runtime: cel::nvidia_runtime_without_gpu(&settings.nvidia_runtime_classes)
                .map(|r| (r, settings.nvidia_runtime_classes.join(", "))),
        }
    }
}

/// The rules both rule sets apply: no GPU reached outside the device plugin's resource names.
/// `who` starts each message.
fn device_access(who: &Who, rules: &BypassExpressions) -> Vec<Validation> {
    let mut out = vec![
        who.refuses(
            &rules.sets_device_env,
            &format!(
                ": a container may not set NVIDIA's device-selecting variables ({}), directly or through an envFrom prefix that starts one: NVIDIA's container toolkit would give it GPUs no quota counts; ask for a GPU resource instead",
                cel::DEVICE_ENV.join(", ")
            ),
        ),
        who.refuses(
            &rules.sets_limit_env,
            &format!(
                ": a container may not set a variable that sets its GPU limits ({}*), directly or through an envFrom prefix: the node sets them from the plan (docs/concepts/isolation.md#memory-limits); remove the variable",
                cel::LIMIT_ENV_PREFIXES.join("*, ")
            ),
        ),
        who.refuses(
            &rules.privileged,
            ": a container may not be privileged or add SYS_ADMIN (or ALL): it would reach every GPU of its node outside the device plugin",
        ),
        who.refuses(
            &rules.host_device_path,
            ": a hostPath volume may not reach /dev, NVIDIA's runtime directories (/run/nvidia*, /var/run/nvidia*) or the kubelet's plugin sockets (/var/lib/kubelet), nor a directory above them, nor name a path with // or /./",
        ),
        who.refuses(
            &rules.mounts_device_list,
            ": a container may not mount anything at a path with nvidia-container-devices in it: NVIDIA's toolkit reads device lists from mounts there",
        ),
        who.refuses(
            &rules.cdi_annotation,
            &format!(
                ": a pod may not carry CDI device annotations ({}*): the runtime would inject the devices they name",
                cel::CDI_ANNOTATION_PREFIXES.join("*, ")
            ),
        ),
    ];
    if let Some((runtime, classes)) = &rules.nvidia_runtime {
        out.push(who.refuses(
            runtime,
            &format!(
                ": a pod that asks for no GPU may not run under NVIDIA's runtime class ({classes}): the runtime honours an image's own NVIDIA_VISIBLE_DEVICES (CUDA images set it to all)"
            ),
        ));
    }
    out
}

/// The validations of the tenants' pod policy, one for every tenant: each tenant's binding names
/// it as the parameter ([`cel::param_variables`]), so the tenant's name, tier, grants,
/// PriorityClasses and `maxGpusPerPod` are read from it, not written into the expressions.
pub fn tenant(bypass: &BypassExpressions) -> Vec<Validation> {
    let who = Who::Cel("variables.who");
    let mut out = device_access(&who, bypass);
    out.push(validation_with(
        &format!("{} && variables.asked.exists(k, !(k in variables.granted))", when::RESOURCES_SET),
        format!(
            "variables.admitted ? variables.who + ' may not use ' + variables.asked.filter(k, !(k in variables.granted)).distinct().join(', ') + ': it was granted ' + {granted} + ' (a GPU resource not granted is refused, not unlimited)' : variables.who + ' is not valid, so its pods get no GPUs; see its Valid condition (a tenant whose status the controller has not written yet is not valid either)'",
            granted = cel::shown("variables.granted"),
        ),
    ));
    out.push(validation_with(
        &cel::tolerates_other_than(SHARING, "variables.sharedModes"),
        format!(
            "variables.who + ' may tolerate the taint {SHARING} only with operator Equal and the value of a mode it holds shares of (' + {} + '): MPS and time-sliced GPUs are both nvidia.com/gpu.shared, and the taint is what keeps a tenant to its own'",
            cel::shown("variables.sharedModes"),
        ),
    ));
    out.push(validation_with(
        &format!(
            "{} && has(object.spec.priorityClassName) && object.spec.priorityClassName != '' && !(object.spec.priorityClassName in variables.priorityClasses)",
            when::CREATED,
        ),
        "variables.who + ' may name only the PriorityClasses its tier lists (' + (size(variables.priorityClasses) == 0 ? 'none: leave priorityClassName unset' : variables.priorityClasses.join(', ')) + '): a higher class could preempt other tenants\\' GPU pods; ask the platform team to add the class to tier ' + params.spec.tier + '\\'s priorityClassNames' + (variables.admitted ? '' : ' (a tenant that is not valid may name none)')".to_string(),
    ));
    out.push(validation_with(
        &format!("{} && variables.maxGpus >= 0 && variables.gpus > variables.maxGpus", when::RESOURCES_SET),
        "variables.who + ' allows at most ' + string(variables.maxGpus) + ' GPUs per pod (spec.limits.maxGpusPerPod); this pod holds ' + string(variables.gpus) + ' at once (its containers, sidecars and the largest init container, as Kubernetes counts a pod\\'s request)'".to_string(),
    ));
    out.push(who.refuses(
        &cel::tolerates(SCRUB_PENDING, None),
        &format!(" may not tolerate {SCRUB_PENDING}: a node carries it while a GPU changes hands and its memory is not yet scrubbed"),
    ));
    out.push(who.refuses(
        &cel::any_toleration(),
        ": a toleration without a key tolerates every taint, including other tenants' dedicated nodes; name the taints to tolerate",
    ));
    out.push(validation_with(
        &cel::tolerates_other_than(DEDICATED, "[params.metadata.name]"),
        format!("variables.who + ' may tolerate only its own dedicated nodes ({DEDICATED}=' + params.metadata.name + '), not another tenant\\'s'"),
    ));
    out.push(validation_with(
        &cel::selects_dedicated_other_than("params.metadata.name"),
        format!("variables.who + ' may select only its own dedicated nodes ({DEDICATED}=' + params.metadata.name + '), by node selector or required node affinity, when the pod is created or while it is gated, not another tenant\\'s'"),
    ));
    out.push(who.refuses(
        cel::NAMES_NODE,
        ": a pod may not name its node (spec.nodeName bypasses the scheduler and the taints that keep dedicated nodes); use a node selector",
    ));
    out.push(who.refuses(
        cel::ANY_HOST_PATH,
        ": a pod may not mount a host path (the namespace's Pod Security level refuses it too)",
    ));
    out
}

/// The validations of the policy for namespaces of no tenant.
pub fn untenanted(bypass: &BypassExpressions) -> Vec<Validation> {
    let who = "the namespace belongs to no GpuTenant";
    let mut out = device_access(&Who::Fixed(who), bypass);
    out.push(validation(
        &format!("{} && size(variables.asked) > 0", when::RESOURCES_SET),
        format!("{who}, so its pods get no GPUs; add it to a tenant's spec.namespaces"),
    ));
    out.push(validation(
        &format!(
            "{} || {} || {} || {}",
            cel::tolerates(DEDICATED, None),
            cel::tolerates(SHARING, None),
            cel::tolerates(SCRUB_PENDING, None),
            cel::any_toleration()
        ),
        format!(
            "{who}, so its pods may not tolerate the taints of GPU nodes ({DEDICATED}, {SHARING}, {SCRUB_PENDING}) or every taint"
        ),
    ));
    out.push(validation(
        &format!("{} && {}", when::AFFINITY_SET, cel::may_land_on_gpu_nodes()),
        format!(
            "{who}, so its pods stay off GPU nodes: every term of their required node affinity must require that neither {} exists (the controller's mutating policy {} adds this to every new pod; an update may not take it away); add the namespace to a tenant's spec.namespaces, or exempt it with the controller's --exempt-namespace",
            cel::GPU_NODE_LABELS.join(" nor "),
            cel::OFF_GPU_NODES,
        ),
    ));
    out.push(validation(
        cel::NAMES_NODE,
        format!(
            "{who}, so its pods may not name their node (spec.nodeName bypasses the scheduler and the taints that keep them off GPU nodes); use a node selector, or exempt the namespace with the controller's --exempt-namespace"
        ),
    ));
    out
}
