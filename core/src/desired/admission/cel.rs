//! CEL expressions of the admission policies, built in one place. Each `fn` returns an expression
//! over a Pod (`object`) that is true when the pod does what its name says; a validation refuses
//! the pod when it is (`validation`). They run in the API server's CEL environment (Kubernetes
//! 1.37: the `lists` extension with `lists.range`, `slice` and `flatten`, two-variable
//! comprehensions, `quantity`), and the e2e suite checks every policy type-checks there.

use k8s_openapi::api::admissionregistration::v1::Validation;
use serde_json::{Value, json};

use crate::device_plugin::{DRA_RESOURCE_DOMAIN, GPU_RESOURCE_PREFIXES};

/// Environment variables through which NVIDIA's container toolkit selects devices for a
/// container, whatever the pod asked the scheduler for (nvidia-container-toolkit
/// `internal/config/image/envvars.go`; `NVIDIA_VISIBLE_DEVICES=all` in a pod that asks for no GPU
/// gets every GPU of its node under the toolkit's default
/// `accept-nvidia-visible-devices-envvar-when-unprivileged = true`; the MIG variables are read
/// by its legacy hook; the last four add devices in its jit-cdi mode).
pub const DEVICE_ENV: [&str; 8] = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_GDRCOPY",
    "NVIDIA_NVSWITCH",
];

/// Prefixes of the environment variables that set a container's GPU limits: the memory cap that
/// NVIDIA's container toolkit applies through the driver (`NVIDIA_GPU_MEMORY_REQUEST`,
/// `NVIDIA_GPU_MEMORY_LIMIT`, read from the container's OCI spec by its
/// `apply-cuda-memory-limits` hook), an MPS client's limits and daemon (`CUDA_MPS_*`: pinned
/// memory, active threads, the pipe of the daemon it joins), and the limits of HAMi's CUDA
/// interposer (`CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_SM_LIMIT`). Only the node's agent (through
/// the CDI spec it writes) or the device plugin sets them: a value of the pod's own would replace
/// or join the planned one.
pub const LIMIT_ENV_PREFIXES: [&str; 4] = [
    "NVIDIA_GPU_MEMORY_",
    "CUDA_MPS_",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
];

/// Host paths through which a container reaches GPUs or the node's GPU plumbing without the
/// device plugin: device nodes (and `/dev/null`, which the toolkit's volume-mount device lists
/// use as the source of a mount that selects devices), NVIDIA's runtime directories (driver
/// root, MPS pipes, persistenced) and the kubelet's plugin sockets (a process that can reach
/// them can register a device plugin or a DRA driver). A hostPath at, below or above one of
/// them is refused; `/run/nvidia` and `/var/run/nvidia` are prefixes (`/run/nvidia-persistenced`).
const DEVICE_PATHS: [&str; 2] = ["/dev", "/var/lib/kubelet"];
const DEVICE_PATH_PREFIXES: [&str; 2] = ["/run/nvidia", "/var/run/nvidia"];

/// Pod annotations that name CDI devices for the runtime to inject: NVIDIA's NRI plugin reads
/// `nvidia.cdi.k8s.io/` from pods (any pod could name any GPU), and `cdi.k8s.io/` is the CDI
/// annotation prefix runtimes accept from a device plugin's answer.
pub const CDI_ANNOTATION_PREFIXES: [&str; 2] = ["cdi.k8s.io/", "nvidia.cdi.k8s.io/"];

/// Capabilities that make a container "privileged" to NVIDIA's toolkit (it honours
/// `NVIDIA_VISIBLE_DEVICES` for containers with `CAP_SYS_ADMIN` even when unprivileged ones are
/// refused), in the spellings Kubernetes and runtimes accept.
const PRIVILEGED_CAPABILITIES: [&str; 3] = ["SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"];

/// A CEL list literal of strings.
pub fn list(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let quoted: Vec<String> = items.into_iter().map(|s| quote(s.as_ref())).collect();
    format!("[{}]", quoted.join(", "))
}

/// A CEL string literal of any text: quotes and backslashes escaped.
pub fn text(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Who a policy's messages name: a fixed text (the no-tenant rules), or a CEL string expression
/// (the tenants' policy names the tenant of its parameter).
pub enum Who<'a> {
    Fixed(&'a str),
    Cel(&'a str),
}

impl Who<'_> {
    /// A validation refusing what `forbidden_when` is true for, its message `rest` after who.
    pub fn refuses(&self, forbidden_when: &str, rest: &str) -> Validation {
        match self {
            Who::Fixed(who) => validation(forbidden_when, format!("{who}{rest}")),
            Who::Cel(who) => validation_with(forbidden_when, format!("{who} + {}", text(rest))),
        }
    }
}

/// A CEL string literal. Names here are Kubernetes names and our constants: no quotes or
/// backslashes, which are refused rather than escaped.
pub fn quote(s: &str) -> String {
    assert!(
        !s.contains(['\'', '\\', '\n']),
        "CEL literal {s:?}: names never hold quotes, backslashes or newlines"
    );
    format!("'{s}'")
}

/// CEL: is resource name `k` a GPU resource (under a GPU prefix or the DRA mode's domain, not
/// explicitly allowed)?
pub fn is_gpu_resource(k: &str, allowed: &[String]) -> String {
    let mut prefixes: Vec<String> = GPU_RESOURCE_PREFIXES
        .iter()
        .map(|p| format!("{k}.startsWith({})", quote(p)))
        .collect();
    // `[.]`, not a backslash: CEL literals here hold none.
    let domain = DRA_RESOURCE_DOMAIN.replace('.', "[.]");
    prefixes.push(format!("{k}.matches({})", quote(&format!("^[^/]*{domain}/"))));
    let mut out = format!("({})", prefixes.join(" || "));
    if !allowed.is_empty() {
        out = format!("({out} && !({k} in {}))", list(allowed));
    }
    out
}

/// The variables every pod policy uses: the pod's containers, its GPU resource names, and the
/// GPUs it holds at once the way Kubernetes counts a pod's effective request
/// (`k8s.io/component-helpers/resource` `AggregateContainerRequests`): the regular containers
/// and the sidecars (init containers with `restartPolicy: Always`) run together, and each init
/// container runs beside the sidecars started before it; the pod holds the larger of the two.
pub fn variables(allowed: &[String]) -> Value {
    let gpu = is_gpu_resource("k", allowed);
    let units = format!(
        "(has(c.resources) && has(c.resources.limits) ? c.resources.limits.filter(k, {gpu}).map(k, quantity(string(c.resources.limits[k])).asInteger()).sum() : 0)"
    );
    let names = format!(
        "(has(c.resources) ? (has(c.resources.limits) ? c.resources.limits.filter(k, {gpu}) : []) + (has(c.resources.requests) ? c.resources.requests.filter(k, {gpu}) : []) : [])"
    );
    let sidecar = "(has(c.restartPolicy) && c.restartPolicy == 'Always')";
    json!([
        {"name": "inits", "expression": "has(object.spec.initContainers) ? object.spec.initContainers : []"},
        {"name": "containers", "expression": "object.spec.containers + variables.inits"},
        {"name": "ephemerals", "expression": "has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : []"},
        // Every GPU resource name any container asks for (limits or requests).
        {"name": "asked", "expression": format!("variables.containers.map(c, {names}).flatten()")},
        {"name": "regularGpus", "expression": format!("object.spec.containers.map(c, {units})")},
        {"name": "initGpus", "expression": format!("variables.inits.map(c, {units})")},
        {"name": "sidecarGpus", "expression": format!("variables.inits.map(c, {sidecar} ? {units} : 0)")},
        // While init container i runs: itself and the sidecars before it (a sidecar counts once).
        {"name": "initUse", "expression": "variables.initGpus.transformList(i, g, g + variables.sidecarGpus.slice(0, i).sum())"},
        {"name": "gpus", "expression":
            "[variables.regularGpus.sum() + variables.sidecarGpus.sum(), (variables.initUse + [0]).max()].max()"},
    ])
}

/// CEL: when a rule on a pod field is judged. Most pod fields cannot change after creation, so a
/// rule is judged when the pod is created, or when the field it reads is changed: an update that
/// leaves the field alone (a label, a finalizer removed) is never refused for what the pod was
/// admitted with under earlier rules (a pod stuck with its finalizer would be worse).
pub mod when {
    /// Immutable fields (resources, volumes, nodeName, priorityClassName, runtimeClassName).
    pub const CREATED: &str = "request.operation == 'CREATE'";
    /// Tolerations: an update may add some.
    pub const TOLERATIONS_SET: &str = "(request.operation == 'CREATE' || (has(object.spec.tolerations) ? object.spec.tolerations : []) != (has(oldObject.spec.tolerations) ? oldObject.spec.tolerations : []))";
    /// Annotations: an update may add some, and a restarted container sees them.
    pub const ANNOTATIONS_SET: &str = "(request.operation == 'CREATE' || (has(object.metadata.annotations) ? object.metadata.annotations : {}) != (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}))";
    /// Container resources: created, or resized in place (the `resize` subresource; Kubernetes
    /// lets it change CPU and memory only, but the rules do not lean on that).
    pub const RESOURCES_SET: &str = "(request.operation == 'CREATE' || request.subResource == 'resize')";
    /// The node selector: an update may add entries while the pod has scheduling gates.
    pub const NODE_SELECTOR_SET: &str = "(request.operation == 'CREATE' || (has(object.spec.nodeSelector) ? object.spec.nodeSelector : {}) != (has(oldObject.spec.nodeSelector) ? oldObject.spec.nodeSelector : {}))";
    /// Affinity: an update may add node affinity while the pod has scheduling gates.
    pub const AFFINITY_SET: &str = "(request.operation == 'CREATE' || has(object.spec.affinity) != has(oldObject.spec.affinity) || (has(object.spec.affinity) && object.spec.affinity != oldObject.spec.affinity))";
}

/// The mutating policy (and its binding) that keeps the pods of namespaces of no tenant off GPU
/// nodes; the no-tenant rules name it when they refuse a pod without its affinity.
pub const OFF_GPU_NODES: &str = "gputenancy.io-off-gpu-nodes";

/// Node labels that mark a GPU node: ours, on every node a GpuPartitionPlan governs, and GPU
/// feature discovery's, on every node with an NVIDIA GPU. A pod of no tenant must require that
/// neither exists.
pub const GPU_NODE_LABELS: [&str; 2] = [crate::labels::DEVICE_ACCESS, crate::labels::GPU_PRESENT];

/// CEL: the pod's required node affinity terms (an empty list when it has none).
const REQUIRED_TERMS: &str = "(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) ? object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms : [])";

/// CEL: the pod may be placed on a GPU node: it has no required node affinity, or one of its terms
/// (terms are alternatives) does not require every [`GPU_NODE_LABELS`] label to be absent.
pub fn may_land_on_gpu_nodes() -> String {
    format!(
        "(size({REQUIRED_TERMS}) == 0 || {REQUIRED_TERMS}.exists(t, !has(t.matchExpressions) || {}.exists(k, !t.matchExpressions.exists(m, m.key == k && m.operator == 'DoesNotExist'))))",
        list(GPU_NODE_LABELS)
    )
}

/// CEL: the pod's required node affinity or its node selector asks for the dedicated nodes of a
/// tenant other than `own` (a CEL string expression).
pub fn selects_dedicated_other_than(own: &str) -> String {
    let key = quote(crate::labels::DEDICATED);
    format!(
        "({sel} && has(object.spec.nodeSelector) && {key} in object.spec.nodeSelector && object.spec.nodeSelector[{key}] != {own}) || ({aff} && {REQUIRED_TERMS}.exists(t, has(t.matchExpressions) && t.matchExpressions.exists(m, m.key == {key} && m.operator == 'In' && has(m.values) && m.values.exists(v, v != {own}))))",
        sel = when::NODE_SELECTOR_SET,
        aff = when::AFFINITY_SET,
    )
}

/// CEL: does a container satisfy `pred` over `c`? Regular and init containers are judged when
/// the pod is created; ephemeral ones (`kubectl debug`) when they are added through the
/// `ephemeralcontainers` subresource.
fn any_container(pred: &str) -> String {
    format!(
        "(({}) && variables.containers.exists(c, {pred})) || (request.subResource == 'ephemeralcontainers' && variables.ephemerals.exists(c, {pred}))",
        when::CREATED
    )
}

/// CEL: a container sets a device-selecting variable, directly or through an `envFrom` prefix
/// that a ConfigMap or Secret key could complete (keys themselves are checked by
/// [`config_key_validation`]).
pub fn sets_device_env() -> String {
    let vars = list(DEVICE_ENV);
    any_container(&format!(
        "(has(c.env) && c.env.exists(e, e.name in {vars})) || (has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != '' && {vars}.exists(v, v.startsWith(f.prefix))))"
    ))
}

/// CEL: a container sets a variable that sets a GPU limit ([`LIMIT_ENV_PREFIXES`]), directly or
/// through an `envFrom` prefix that could start one (a prefix `CUDA_` completed by a key `MPS_X`)
/// or that starts with one (every key then names one). Unprefixed keys are checked by
/// [`config_key_validation`].
pub fn sets_limit_env() -> String {
    let prefixes = list(LIMIT_ENV_PREFIXES);
    any_container(&format!(
        "(has(c.env) && c.env.exists(e, {prefixes}.exists(p, e.name.startsWith(p)))) || (has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != '' && {prefixes}.exists(p, p.startsWith(f.prefix) || f.prefix.startsWith(p))))"
    ))
}

/// CEL: a container is privileged, or holds a capability that makes it privileged to NVIDIA's
/// toolkit (a privileged container gets every device of the node).
pub fn privileged() -> String {
    any_container(&format!(
        "has(c.securityContext) && ((has(c.securityContext.privileged) && c.securityContext.privileged) || (has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) && c.securityContext.capabilities.add.exists(x, x.upperAscii() in {})))",
        list(PRIVILEGED_CAPABILITIES)
    ))
}

/// CEL: a container mounts something where NVIDIA's toolkit reads volume-mount device lists
/// (`/var/run/nvidia-container-devices/<device>`).
pub fn mounts_device_list() -> String {
    any_container("has(c.volumeMounts) && c.volumeMounts.exists(m, m.mountPath.contains('nvidia-container-devices'))")
}

/// The regular expressions of host paths at or below one of `paths` (or starting with one of
/// `prefixes`), above one (an ancestor directory holds it; trailing slashes allowed), and aliases
/// (`//`, `/./`, a final `/.`) that name a path another way: a path is compared as written, so
/// any spelling but the plain one is refused. The API server already refuses `..` in a hostPath.
/// Each path is a plain absolute path; its regular-expression characters are escaped here.
fn path_regexes(paths: &[&str], prefixes: &[&str]) -> [String; 3] {
    let escaped = |ps: &[&str]| ps.iter().map(|p| regex_escape(p)).collect::<Vec<_>>().join("|");
    let below = match (paths.is_empty(), prefixes.is_empty()) {
        (false, true) => format!("^({})(/.*)?$", escaped(paths)),
        (true, false) => format!("^({}).*$", escaped(prefixes)),
        _ => format!("^(({})(/.*)?|({}).*)$", escaped(paths), escaped(prefixes)),
    };
    let mut ancestors = std::collections::BTreeSet::new();
    for p in paths.iter().chain(prefixes.iter()) {
        let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
        for n in 1..parts.len() {
            ancestors.insert(regex_escape(&format!("/{}", parts[..n].join("/"))));
        }
    }
    let above = if ancestors.is_empty() {
        "^/*$".to_string()
    } else {
        format!("^(/*|({})/*)$", ancestors.into_iter().collect::<Vec<_>>().join("|"))
    };
    [below, above, "(//|/\\./|/\\.$)".to_string()]
}

/// `s` with the characters RE2 reads as operators escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The device paths' regular expressions ([`DEVICE_PATHS`], [`DEVICE_PATH_PREFIXES`]).
fn device_path_regexes() -> [String; 3] {
    path_regexes(&DEVICE_PATHS, &DEVICE_PATH_PREFIXES)
}

/// A CEL raw string literal (a regular expression's backslashes stay as written).
fn raw(s: &str) -> String {
    assert!(
        !s.contains(['\'', '\n']),
        "CEL raw literal {s:?}: no quotes or newlines"
    );
    format!("r'{s}'")
}

/// CEL: a hostPath volume reaches a device path.
pub fn host_device_path() -> String {
    host_path_matching(&device_path_regexes())
}

/// CEL: a new pod has a hostPath volume matching one of `regexes` (host paths cannot change after
/// creation).
fn host_path_matching(regexes: &[String]) -> String {
    let tests: Vec<String> = regexes
        .iter()
        .map(|r| format!("v.hostPath.path.matches({})", raw(r)))
        .collect();
    format!(
        "{} && has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && ({}))",
        when::CREATED,
        tests.join(" || ")
    )
}

/// Host paths of the files that decide who gets which GPU, beside the configured CDI spec
/// directories and agent state directories: NVIDIA's container toolkit's and runtime's
/// configuration (whether an image's `NVIDIA_VISIBLE_DEVICES` is honoured, which CDI devices
/// exist: the GPU Operator installs the toolkit under `/usr/local/nvidia`), the container
/// runtimes' configuration (which directories CDI specs are read from), and `/proc`, through whose
/// `/proc/<pid>/root` and `/proc/<pid>/cwd` every host path is reachable again.
pub const NODE_FILE_PATHS: [&str; 6] = [
    "/etc/nvidia-container-runtime",
    "/etc/nvidia-container-toolkit",
    "/usr/local/nvidia",
    "/etc/containerd",
    "/etc/crio",
    "/proc",
];

/// The host paths no pod outside the trusted namespaces may mount: the CDI spec directories and
/// the agents' state (each with its other spelling through `/var/run` -> `/run`), and
/// [`NODE_FILE_PATHS`].
pub fn node_file_paths(settings: &crate::desired::Settings) -> Vec<String> {
    let mut out: Vec<String> = settings
        .cdi_spec_dirs
        .iter()
        .chain(&settings.agent_state_dirs)
        .flat_map(|p| with_run_alias(p.trim_end_matches('/')))
        .chain(NODE_FILE_PATHS.iter().map(|p| p.to_string()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `path` and its other spelling through the `/var/run` -> `/run` link most distributions have.
pub fn with_run_alias(path: &str) -> Vec<String> {
    let mut out = vec![path.to_string()];
    if let Some(rest) = path.strip_prefix("/var/run/") {
        out.push(format!("/run/{rest}"));
    } else if let Some(rest) = path.strip_prefix("/run/") {
        out.push(format!("/var/run/{rest}"));
    }
    out
}

/// CEL: a hostPath volume reaches one of `paths` (at, below or above it, or by an alias).
pub fn host_path_reaching(paths: &[String]) -> String {
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    host_path_matching(&path_regexes(&paths, &[]))
}

/// CEL: any hostPath volume (tenant namespaces take none: Pod Security `baseline` refuses them
/// too; this holds if the namespace's labels are changed).
pub const ANY_HOST_PATH: &str =
    "request.operation == 'CREATE' && has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))";

/// CEL: the pod carries an annotation naming CDI devices.
pub fn cdi_annotation() -> String {
    let tests: Vec<String> = CDI_ANNOTATION_PREFIXES
        .iter()
        .map(|p| format!("k.startsWith({})", quote(p)))
        .collect();
    format!(
        "{} && has(object.metadata.annotations) && object.metadata.annotations.exists(k, {})",
        when::ANNOTATIONS_SET,
        tests.join(" || ")
    )
}

/// CEL: the pod runs under one of NVIDIA's runtime classes without asking for a GPU (NVIDIA's
/// runtime honours an image's own `NVIDIA_VISIBLE_DEVICES=all`, as CUDA images set it).
pub fn nvidia_runtime_without_gpu(classes: &[String]) -> Option<String> {
    (!classes.is_empty()).then(|| {
        format!(
            "{} && has(object.spec.runtimeClassName) && object.spec.runtimeClassName in {} && size(variables.asked) == 0",
            when::CREATED,
            list(classes)
        )
    })
}

/// CEL: does the pod tolerate taint `key` with `value` (or any value when `None`)?
pub fn tolerates(key: &str, value: Option<&str>) -> String {
    let value_match = match value {
        Some(v) => format!("(has(t.value) && t.value == {})", quote(v)),
        None => "true".into(),
    };
    format!(
        "{} && has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == {} && ((has(t.operator) && t.operator == 'Exists') || {value_match}))",
        when::TOLERATIONS_SET,
        quote(key)
    )
}

/// CEL: the pod tolerates taint `key` with a value outside `values`, a CEL list of strings (or
/// with `Exists`, any value).
pub fn tolerates_other_than(key: &str, values: &str) -> String {
    format!(
        "{} && has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key == {} && ((has(t.operator) && t.operator == 'Exists') || !has(t.value) || !(t.value in {values})))",
        when::TOLERATIONS_SET,
        quote(key),
    )
}

/// The variables the tenants' policies read from their parameter, the tenant itself: who it is
/// for the messages (`who`: name and tier), whether its `status.admission` is there (`admitted`:
/// a tenant not valid, or whose status is not written yet, has none and gets no GPU), the GPU
/// resource names its pods may ask for (`granted`), the sharing taint values they may tolerate
/// (`sharedModes`), the DeviceClasses its claims may name (`ownClasses`), the PriorityClasses its
/// pods may name (`priorityClasses`; each list is empty when `admitted` is not) and its
/// `spec.limits.maxGpusPerPod` (`maxGpus`, -1 when unset).
pub fn param_variables() -> Value {
    let field =
        |f: &str| format!("variables.admitted && has(params.status.admission.{f}) ? params.status.admission.{f} : []");
    json!([
        {"name": "who", "expression": "'GpuTenant ' + params.metadata.name + ' (tier ' + params.spec.tier + ')'"},
        {"name": "admitted", "expression": "has(params.status) && has(params.status.admission)"},
        {"name": "granted", "expression": field("resourceNames")},
        {"name": "sharedModes", "expression": field("sharedModes")},
        {"name": "ownClasses", "expression": field("deviceClasses")},
        {"name": "priorityClasses", "expression": field("priorityClassNames")},
        {"name": "maxGpus", "expression":
            "has(params.spec.limits) && has(params.spec.limits.maxGpusPerPod) ? int(params.spec.limits.maxGpusPerPod) : -1"},
    ])
}

/// CEL: a list of strings as a message shows it: joined with commas, or `none`.
pub fn shown(list: &str) -> String {
    format!("(size({list}) == 0 ? 'none' : {list}.join(', '))")
}

/// CEL: a toleration without a key and with `Exists`: it tolerates every taint.
pub fn any_toleration() -> String {
    format!(
        "{} && has(object.spec.tolerations) && object.spec.tolerations.exists(t, (!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists')",
        when::TOLERATIONS_SET
    )
}

/// CEL: a new pod names its node, bypassing the scheduler and so every taint. Mirror pods, which
/// a kubelet creates for its static pods, come from the node itself.
pub const NAMES_NODE: &str = "request.operation == 'CREATE' && has(object.spec.nodeName) && object.spec.nodeName != '' && !('system:nodes' in request.userInfo.groups)";

/// A validation refusing what `forbidden_when` is true for, with a fixed message.
pub fn validation(forbidden_when: &str, message: String) -> Validation {
    Validation {
        expression: refusing(forbidden_when),
        message: Some(exact(message)),
        message_expression: None,
        reason: Some("Forbidden".into()),
    }
}

/// The expression that holds where `forbidden_when` does not.
fn refusing(forbidden_when: &str) -> String {
    ["!(", forbidden_when, ")"].concat()
}

/// `s` in memory of its own length. A string `format!` builds can hold twice that (it grows by
/// doubling), and these are kept: two policies per tenant of a dozen rules of up to kilobytes
/// each, 35 MB more at 2,000 tenants than the same text held exactly.
pub fn exact(mut s: String) -> String {
    s.shrink_to_fit();
    s
}

/// A validation refusing what `forbidden_when` is true for, with a message built in CEL.
pub fn validation_with(forbidden_when: &str, message_expression: String) -> Validation {
    Validation {
        expression: refusing(forbidden_when),
        message: None,
        message_expression: Some(exact(message_expression)),
        reason: Some("Forbidden".into()),
    }
}

/// For a policy on ConfigMaps and Secrets: refuse keys named like a device-selecting variable or
/// a limit-setting one (`envFrom` without a prefix turns every key into a variable of that name).
pub fn config_key_validation(message_prefix: &str) -> Validation {
    let vars = list(DEVICE_ENV);
    let prefixes = list(LIMIT_ENV_PREFIXES);
    let named = format!("(k in {vars} || {prefixes}.exists(p, k.startsWith(p)))");
    let keys = format!(
        "(has(object.data) && object.data.exists(k, {named})) || (has(object.binaryData) && object.binaryData.exists(k, {named})) || (request.resource.resource == 'secrets' && has(object.stringData) && object.stringData.exists(k, {named}))"
    );
    validation_with(
        &keys,
        format!(
            "{} + ': a key named like one of NVIDIA\\'s device-selecting variables ({}) or a GPU limit ({}*) would let a pod that loads this object with envFrom pick GPUs outside its grant or raise its limits; rename the key'",
            message_prefix,
            DEVICE_ENV.join(", "),
            LIMIT_ENV_PREFIXES.join("*, ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host-path patterns, as RE2 would apply them (plain regular expressions: the `regex`
    /// crate and RE2 read them alike), against paths written out by hand.
    #[test]
    fn device_paths_cover_below_above_and_aliases() {
        let res: Vec<regex::Regex> = device_path_regexes()
            .iter()
            .map(|r| regex::Regex::new(r).unwrap())
            .collect();
        let refused = |p: &str| res.iter().any(|r| r.is_match(p));
        for p in [
            "/",
            "//",
            "/dev",
            "/dev/",
            "/dev/nvidia0",
            "/dev/null",
            "/run",
            "/run/",
            "/run/nvidia",
            "/run/nvidia/mps",
            "/run/nvidia-persistenced/socket",
            "/var",
            "/var/run",
            "/var/run/nvidia",
            "/var/run/nvidia-container-devices",
            "/var/lib",
            "/var/lib/kubelet",
            "/var/lib/kubelet/device-plugins/kubelet.sock",
            "/var/lib/kubelet/plugins_registry",
            "/opt//dev",
            "/./dev",
            "/data/.",
        ] {
            assert!(refused(p), "{p} must be refused");
        }
        for p in [
            "/data",
            "/data/models",
            "/var/log",
            "/var/lib/containerd",
            "/opt/dev",
            "/devices",
            "/runner",
        ] {
            assert!(!refused(p), "{p} must be admitted");
        }
    }

    /// The node's hand-over files, with the default settings: the CDI spec directories by both
    /// spellings, the agent's state, the toolkit's and runtimes' configuration, and every path
    /// into `/proc`, at, below and above; neighbours with similar names are admitted.
    #[test]
    fn node_file_paths_cover_cdi_state_toolkit_and_proc() {
        let paths = node_file_paths(&crate::desired::Settings::default());
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let res: Vec<regex::Regex> = path_regexes(&refs, &[])
            .iter()
            .map(|r| regex::Regex::new(r).unwrap())
            .collect();
        let refused = |p: &str| res.iter().any(|r| r.is_match(p));
        for p in [
            "/etc/cdi",
            "/etc/cdi/",
            "/etc/cdi/nvidia.yaml",
            "/var/run/cdi",
            "/run/cdi",
            "/run/cdi/gputenancy.io-gpu_x.json",
            "/var/lib/gpu-tenancy",
            "/var/lib/gpu-tenancy/dra-checkpoint.json",
            "/etc/nvidia-container-runtime/config.toml",
            "/usr/local/nvidia/toolkit",
            "/etc/containerd/config.toml",
            "/proc",
            "/proc/1/root",
            "/proc/self/root/var/run/cdi",
            "/proc/1/cwd",
            "/etc",
            "/etc/",
            "/var",
            "/var/lib",
            "/usr/local",
            "/",
            "/etc//cdi",
            "/etc/./cdi",
        ] {
            assert!(refused(p), "{p} must be refused");
        }
        for p in [
            "/etc/cdi-backup",
            "/var/lib/gpu-tenancy-other",
            "/var/log",
            "/data",
            "/etc/ssl/certs",
            "/usr/share/zoneinfo",
            "/var/lib/containerd",
            "/processes",
        ] {
            assert!(!refused(p), "{p} must be admitted");
        }
        // A configured directory is escaped, not read as a pattern.
        let res = path_regexes(&["/srv/c.d"], &[]);
        let below = regex::Regex::new(&res[0]).unwrap();
        assert!(below.is_match("/srv/c.d/x") && !below.is_match("/srv/cxd/x"));
    }

    #[test]
    fn literals_refuse_quotes() {
        assert_eq!(list(["a", "b"]), "['a', 'b']");
        assert!(std::panic::catch_unwind(|| quote("a'b")).is_err());
    }

    /// Free text is escaped, not refused: the kubelet's sockets stay one CEL string.
    #[test]
    fn text_escapes_quotes_and_backslashes() {
        assert_eq!(text(r"the kubelet's \d"), r"'the kubelet\'s \\d'");
        let v = Who::Cel("variables.who").refuses("true", ": it's refused");
        assert_eq!(
            v.message_expression.as_deref(),
            Some(r"variables.who + ': it\'s refused'")
        );
        let v = Who::Fixed("no tenant").refuses("true", ": it's refused");
        assert_eq!(v.message.as_deref(), Some("no tenant: it's refused"));
    }
}
