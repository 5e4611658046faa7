//! NVIDIA's device plugin, as this operator configures it: the resource names it advertises, the
//! one-sharing-setting-per-node rule, and the per-node config it reads (docs/nvidia.md#the-device-plugin-and-mig-parted).
//!
//! The plugin applies one sharing setting to every whole (non-MIG) GPU of a node: `rename` and
//! `devices` on a sharing resource are parsed and dropped (k8s-device-plugin#1786). It refuses MPS
//! on a node with MIG devices ("sharing using MPS is not supported for MIG devices",
//! `internal/plugin/mps.go`). Both rules live here, once: plans are checked with [`NodeConfig::of_gpus`]
//! and the controller renders what the same function returns.

use crate::api::{GpuGroup, GpuSpec, Mode, MpsSettings};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Prefixes of the extended resources through which a pod reaches a GPU: NVIDIA's device plugin
/// (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-*`, and any other name it or
/// NVIDIA's DRA driver may advertise), this operator's own, and the names Kubernetes gives every
/// DeviceClass (`deviceclass.resource.kubernetes.io/<class>`, DRA extended resources). With the
/// tenants' own names of the DRA mode (`<tenant>.gputenancy.io/...`, [`DRA_RESOURCE_DOMAIN`]),
/// everything under them is an allow-list per tenant: a name nobody granted is refused, not merely
/// unlimited.
pub const GPU_RESOURCE_PREFIXES: [&str; 3] = ["nvidia.com/", "gputenancy.io/", "deviceclass.resource.kubernetes.io/"];

/// A resource name whose domain ends in this is one of the DRA mode's per-tenant names.
pub const DRA_RESOURCE_DOMAIN: &str = ".gputenancy.io";

/// Is `name` a GPU resource name (under [`GPU_RESOURCE_PREFIXES`], or in a subdomain of
/// [`DRA_RESOURCE_DOMAIN`])?
pub fn is_gpu_resource(name: &str) -> bool {
    GPU_RESOURCE_PREFIXES.iter().any(|p| name.starts_with(p))
        || name
            .split_once('/')
            .is_some_and(|(domain, _)| domain.ends_with(DRA_RESOURCE_DOMAIN))
}

/// Whole GPUs, one per request.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Replicas of a shared (MPS or time-sliced) GPU: `renameByDefault: true` advertises them under
/// this name, so a quota can tell a share from a whole GPU.
pub const RESOURCE_SHARED: &str = "nvidia.com/gpu.shared";
/// Prefix of the `mixed` MIG strategy's resource names (`nvidia.com/mig-3g.40gb`).
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// The ConfigMap key of a node with no GPUs planned (no plan selects it, its plan has problems, its
/// agent has not reported): its label names it, and it is also the key config-manager falls back
/// to when it reads the label before its informer has synced (its `named` fallback, the chart's
/// default; set `config.default` to it elsewhere). NVIDIA's code would otherwise run a config
/// the planner never chose: with the `empty` fallback, every GPU as `nvidia.com/gpu`.
pub const UNPLANNED: &str = "default";

/// The config under [`UNPLANNED`]: one the device plugin refuses at start (it exits, advertising
/// nothing; config-manager's sidecar links the node's own config once it has read the label,
/// and the restarted plugin runs that). It is refused through the IMEX channel list, which only
/// the plugin checks (`cmd/nvidia-device-plugin/main.go` `validateFlags` ->
/// `api/config/v1/imex.go` `AssertChannelIDsValid`: "channelIDs must be [] or [0]"), so GPU
/// feature discovery, reading the same config, still labels the node (plans select nodes by
/// its `nvidia.com/gpu.product`), and the MPS daemon gets no MPS config. No environment variable
/// the plugin's chart or the GPU Operator sets overrides it (`IMEX_CHANNEL_IDS` is never set).
pub const UNPLANNED_CONFIG: &str = "\
# gpu-tenancy: no GpuPartitionPlan governs this node (none selects it, its plan has a problem, or
# its agent has not reported yet), so NVIDIA's device plugin must advertise none of its GPUs.
# The plugin refuses the IMEX channel list below on purpose (\"channelIDs must be [] or [0]\")
# and exits instead of advertising every GPU as nvidia.com/gpu; GPU feature discovery does not
# check it and still labels the node. Select the node with a GpuPartitionPlan to use its GPUs.
version: v1
imex:
  channelIDs: [1]
";

/// The resource name of a MIG profile under the `mixed` strategy.
pub fn mig_resource(profile: &str) -> String {
    resource_name(Mode::Mig, Some(profile))
}

/// The resource name a grant of `mode` (and MIG `profile`) is used through: `nvidia.com/gpu` for
/// whole GPUs, `nvidia.com/gpu.shared` for MPS and time-slicing shares (the plugin ignores a
/// `rename`, so both modes share it), `nvidia.com/mig-<profile>` for MIG instances.
pub fn resource_name(mode: Mode, profile: Option<&str>) -> String {
    let mut name = String::new();
    push_resource_name(&mut name, mode, profile);
    name
}

/// [`resource_name`] appended to `out`: a quota key (`requests.<name>`) is built in one string,
/// for every grant of every tenant on every pass, without a second string and a `format!`.
pub fn push_resource_name(out: &mut String, mode: Mode, profile: Option<&str>) {
    match mode {
        Mode::Mig => {
            out.push_str(MIG_RESOURCE_PREFIX);
            out.push_str(profile.unwrap_or_default());
        }
        Mode::Exclusive => out.push_str(RESOURCE_GPU),
        Mode::Mps | Mode::TimeSlicing => out.push_str(RESOURCE_SHARED),
    }
}

/// How the plugin shares a node's whole GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sharing {
    /// One pod per GPU.
    Exclusive,
    /// The plugin's MPS daemon, `replicas` clients per GPU.
    Mps { replicas: u32 },
    /// Time-slicing, `replicas` per GPU.
    TimeSlicing { replicas: u32 },
}

impl Sharing {
    /// The sharing of a whole-GPU mode with its settings; `None` for MIG.
    pub fn of(mode: Mode, mps: Option<&MpsSettings>, replicas: Option<u32>) -> Option<Sharing> {
        match mode {
            Mode::Mig => None,
            Mode::Exclusive => Some(Sharing::Exclusive),
            Mode::Mps => Some(Sharing::Mps {
                replicas: MpsSettings::in_effect(mps).max_clients,
            }),
            Mode::TimeSlicing => Some(Sharing::TimeSlicing {
                replicas: replicas.unwrap_or(0),
            }),
        }
    }

    pub fn of_group(g: &GpuGroup) -> Option<Sharing> {
        Sharing::of(g.mode, g.mps.as_ref(), g.time_slicing.as_ref().map(|t| t.replicas))
    }

    pub fn of_gpu(g: &GpuSpec) -> Option<Sharing> {
        Sharing::of(g.mode, g.mps.as_ref(), g.time_slicing.as_ref().map(|t| t.replicas))
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sharing::Exclusive => f.write_str("Exclusive"),
            Sharing::Mps { replicas } => write!(f, "MPS with {replicas} clients"),
            Sharing::TimeSlicing { replicas } => write!(f, "TimeSlicing with {replicas} replicas"),
        }
    }
}

/// What the plugin must be told about one node: MIG devices present, and the sharing of its whole GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeConfig {
    pub mig: bool,
    /// `None` when the node has no whole GPUs.
    pub sharing: Option<Sharing>,
}

/// Why GPU groups cannot share one node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SharingConflict {
    #[error(
        "the device plugin gives every non-MIG GPU of a node the same sharing (k8s-device-plugin#1786), and {first} differs from {second}; put them in plans for different nodes"
    )]
    Mixed { first: Sharing, second: Sharing },
    #[error(
        "the device plugin refuses MPS on a node with MIG devices (\"sharing using MPS is not supported for MIG devices\"); put MPS GPUs and MIG GPUs on different nodes"
    )]
    MpsWithMig,
}

impl NodeConfig {
    /// Folds the node's GPU groups (in order) into one config. On a conflict, returns the position
    /// of the group that broke the rule and the reason.
    pub fn fold(
        groups: impl IntoIterator<Item = (Mode, Option<Sharing>)>,
    ) -> Result<NodeConfig, (usize, SharingConflict)> {
        let mut config = NodeConfig::default();
        for (i, (mode, sharing)) in groups.into_iter().enumerate() {
            if mode == Mode::Mig {
                config.mig = true;
            }
            if let Some(s) = sharing {
                match config.sharing {
                    Some(first) if first != s => return Err((i, SharingConflict::Mixed { first, second: s })),
                    _ => config.sharing = Some(s),
                }
            }
            if config.mig && matches!(config.sharing, Some(Sharing::Mps { .. })) {
                return Err((i, SharingConflict::MpsWithMig));
            }
        }
        Ok(config)
    }

    /// The config of a node whose GPUs are `gpus`.
    pub fn of_gpus(gpus: &[GpuSpec]) -> Result<NodeConfig, (usize, SharingConflict)> {
        NodeConfig::fold(gpus.iter().map(|g| (g.mode, Sharing::of_gpu(g))))
    }

    /// The key of this config in the plugin's ConfigMap, and the value of the node label
    /// `nvidia.com/device-plugin.config`: `exclusive`, `mig-mixed`, `mps-4`, `mig-mixed.time-slicing-4`.
    pub fn key(&self) -> String {
        let sharing = self.sharing.map(|s| match s {
            Sharing::Exclusive => "exclusive".to_string(),
            Sharing::Mps { replicas } => format!("mps-{replicas}"),
            Sharing::TimeSlicing { replicas } => format!("time-slicing-{replicas}"),
        });
        match (self.mig, sharing) {
            (true, Some(s)) if s != "exclusive" => format!("mig-mixed.{s}"),
            (true, _) => "mig-mixed".into(),
            (false, Some(s)) => s,
            (false, None) => "exclusive".into(),
        }
    }

    /// The plugin's config file for this node (`version: v1`).
    pub fn render(&self) -> PluginConfig {
        let resources = |replicas: u32| SharingResources {
            rename_by_default: true,
            fail_requests_greater_than_one: true,
            resources: vec![SharedResource {
                name: RESOURCE_GPU.into(),
                replicas,
            }],
        };
        PluginConfig {
            version: "v1".into(),
            flags: Flags {
                mig_strategy: Some(if self.mig { "mixed" } else { "none" }.into()),
            },
            imex: None,
            sharing: match self.sharing {
                Some(Sharing::Mps { replicas }) => Some(SharingConfig {
                    mps: Some(resources(replicas)),
                    time_slicing: None,
                }),
                Some(Sharing::TimeSlicing { replicas }) => Some(SharingConfig {
                    mps: None,
                    time_slicing: Some(resources(replicas)),
                }),
                _ => None,
            },
        }
    }
}

/// The device plugin's config file format (`api/config/v1` of k8s-device-plugin), the part we write.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    pub version: String,
    #[serde(default)]
    pub flags: Flags,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imex: Option<Imex>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// `None`: not in the file (the plugin's default, `none`, unless its environment sets one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_strategy: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Imex {
    #[serde(default, rename = "channelIDs")]
    pub channel_ids: Vec<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SharingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<SharingResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<SharingResources>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SharingResources {
    #[serde(default)]
    pub rename_by_default: bool,
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    #[serde(default)]
    pub resources: Vec<SharedResource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SharedResource {
    pub name: String,
    pub replicas: u32,
}

/// The environment NVIDIA's plugin container runs with, as far as it changes the config: an
/// environment variable overrides the config file's flag, whatever its value
/// (`api/config/v1/flags.go` `updateFromCLIFlag`: `c.IsSet(flag)` is true for a flag whose env
/// var exists, and urfave/cli v2 marks it so). The install guide's values must leave
/// `MIG_STRATEGY` unset, or every node gets that one strategy.
#[cfg(test)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginEnv {
    /// `MIG_STRATEGY`.
    pub mig_strategy: Option<String>,
}

#[cfg(test)]
impl PluginEnv {
    /// The plugin's Helm chart with `migStrategy` unset (its default, `null`): the template
    /// renders `MIG_STRATEGY` only `if typeIs "string" .Values.migStrategy`. Also the GPU
    /// Operator with `mig.strategy: ""` (it sets the variable only for a non-empty strategy,
    /// `controllers/object_controls.go` `applyMIGConfiguration`).
    pub fn documented() -> PluginEnv {
        PluginEnv { mig_strategy: None }
    }

    /// `MIG_STRATEGY` set to `strategy`: the chart with `migStrategy` set, or the GPU Operator's
    /// default (`mig.strategy: single`).
    pub fn with_mig_strategy(strategy: &str) -> PluginEnv {
        PluginEnv {
            mig_strategy: Some(strategy.into()),
        }
    }
}

/// What NVIDIA's plugin (k8s-device-plugin at 1b826ac, read with `fetch`) refuses, or does other
/// than the planner meant, when it starts on a node with this config in this environment;
/// `mig_devices`: the node's GPUs have MIG enabled. One message per rule broken, each naming the
/// plugin function the rule comes from. An independent check of what [`NodeConfig::render`]
/// writes, and of the install guide's values.
#[cfg(test)]
pub fn parser_rule_violations(config: &PluginConfig, env: &PluginEnv, mig_devices: bool) -> Vec<String> {
    let mut out = Vec::new();
    // api/config/v1/config.go parseConfig: "unknown version".
    if !(config.version.is_empty() || config.version == "v1") {
        out.push(format!("unknown version {:?} (config.go parseConfig)", config.version));
    }
    // The effective strategy: the environment's, else the file's, else the flag default `none`.
    let strategy = env
        .mig_strategy
        .clone()
        .or_else(|| config.flags.mig_strategy.clone())
        .unwrap_or_else(|| "none".into());
    // cmd/nvidia-device-plugin/main.go validateFlags: "unknown MIG strategy".
    if !["none", "single", "mixed"].contains(&strategy.as_str()) {
        out.push(format!("unknown MIG strategy {strategy:?} (main.go validateFlags)"));
    }
    // validateFlags -> api/config/v1/imex.go AssertChannelIDsValid.
    if let Some(imex) = &config.imex
        && !(imex.channel_ids.is_empty() || imex.channel_ids == [0])
    {
        out.push(format!(
            "invalid IMEX channel IDs: channelIDs must be [] or [0]; found {:?} (main.go validateFlags)",
            imex.channel_ids
        ));
    }
    if let Some(sharing) = &config.sharing {
        for (what, res) in [("mps", &sharing.mps), ("timeSlicing", &sharing.time_slicing)] {
            let Some(res) = res else { continue };
            if res.resources.is_empty() {
                out.push(format!(
                    "sharing.{what}.resources must be present and non-empty (replicas.go)"
                ));
            }
            for r in &res.resources {
                // api/config/v1/replicas.go ReplicatedResource UnmarshalJSON.
                if r.replicas < 2 {
                    out.push(format!(
                        "sharing.{what}: replicas of {} must be >= 2, not {} (replicas.go)",
                        r.name, r.replicas
                    ));
                }
                if !valid_resource_name(&r.name) {
                    out.push(format!(
                        "sharing.{what}: {:?} is not a valid resource name (resources.go NewResourceName)",
                        r.name
                    ));
                }
            }
        }
        let mps = sharing.mps.as_ref().is_some_and(|m| !m.resources.is_empty());
        // validateFlags: "using --mig-strategy=mixed is not supported with MPS".
        if mps && strategy == "mixed" {
            out.push("using --mig-strategy=mixed is not supported with MPS (main.go validateFlags)".into());
        }
        // internal/plugin/mps.go getMPSOptions: MIG devices are enumerated under any strategy
        // but none.
        if mps && mig_devices && strategy != "none" {
            out.push("sharing using MPS is not supported for MIG devices (mps.go getMPSOptions)".into());
        }
    }
    if mig_devices {
        match strategy.as_str() {
            // internal/rm/device_map.go buildGPUDeviceMap: under `none` a MIG-enabled GPU is
            // advertised whole, as nvidia.com/gpu, and its instances not at all.
            "none" => out.push(
                "migStrategy none advertises the node's MIG-enabled GPUs whole as nvidia.com/gpu and none of their instances (device_map.go buildGPUDeviceMap)"
                    .into(),
            ),
            // device_map.go buildDeviceMapFromConfigResources: `single` requires one profile
            // on every GPU of the node, which the planner's layouts do not keep to.
            "single" => out.push(
                "migStrategy single requires every MIG device of the node to be alike and advertises them as nvidia.com/gpu, not nvidia.com/mig-<profile> (device_map.go assertAllMigDevicesAreValid)"
                    .into(),
            ),
            _ => {}
        }
    }
    out
}

/// api/config/v1/resources.go NewResourceName: `nvidia.com/` and a DNS subdomain, 63 at most.
#[cfg(test)]
fn valid_resource_name(name: &str) -> bool {
    let full = if name.contains('/') {
        name.to_string()
    } else {
        format!("nvidia.com/{name}")
    };
    let part = full.strip_prefix("nvidia.com/").unwrap_or("");
    full.starts_with("nvidia.com/")
        && full.len() <= 63
        && !part.is_empty()
        && part.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sharing_per_node() {
        let ts4 = Some(Sharing::TimeSlicing { replicas: 4 });
        let ok = NodeConfig::fold([(Mode::Mig, None), (Mode::TimeSlicing, ts4)]).unwrap();
        assert_eq!(ok.key(), "mig-mixed.time-slicing-4");
        let (at, e) =
            NodeConfig::fold([(Mode::Exclusive, Some(Sharing::Exclusive)), (Mode::TimeSlicing, ts4)]).unwrap_err();
        assert_eq!(at, 1);
        assert!(matches!(e, SharingConflict::Mixed { .. }), "{e}");
        let (_, e) =
            NodeConfig::fold([(Mode::Mig, None), (Mode::Mps, Some(Sharing::Mps { replicas: 4 }))]).unwrap_err();
        assert_eq!(e, SharingConflict::MpsWithMig);
        assert_eq!(
            NodeConfig::fold([(Mode::Mig, None), (Mode::Exclusive, Some(Sharing::Exclusive))])
                .unwrap()
                .key(),
            "mig-mixed"
        );
    }

    fn all_configs() -> Vec<NodeConfig> {
        let mut configs = vec![];
        for mig in [false, true] {
            configs.push(NodeConfig { mig, sharing: None });
            configs.push(NodeConfig {
                mig,
                sharing: Some(Sharing::Exclusive),
            });
            for replicas in [2, 4, 48, 64] {
                configs.push(NodeConfig {
                    mig,
                    sharing: Some(Sharing::TimeSlicing { replicas }),
                });
                if !mig {
                    configs.push(NodeConfig {
                        mig,
                        sharing: Some(Sharing::Mps { replicas }),
                    });
                }
            }
        }
        configs
    }

    /// Every config the renderer can produce starts in NVIDIA's plugin as the install guide
    /// deploys it (no MIG_STRATEGY in its environment) and round-trips through YAML.
    #[test]
    fn rendered_configs_start_under_the_documented_install() {
        for c in &all_configs() {
            let rendered = c.render();
            assert_eq!(
                parser_rule_violations(&rendered, &PluginEnv::documented(), c.mig),
                Vec::<String>::new(),
                "{}",
                c.key()
            );
            let text = serde_saphyr::to_string(&rendered).unwrap();
            let back: PluginConfig = serde_saphyr::from_str(&text).unwrap();
            assert_eq!(back, rendered);
        }
    }

    /// What the install guide said before (the chart's `migStrategy=mixed`, the GPU Operator's
    /// `mig.strategy=mixed`, or its default `single`) puts MIG_STRATEGY in the plugin's
    /// environment, which overrides every node's config: MPS nodes no longer start, and under
    /// `single` or `none` no MIG-mixed node is advertised as planned.
    #[test]
    fn a_mig_strategy_in_the_environment_breaks_some_mode() {
        let mps = NodeConfig {
            mig: false,
            sharing: Some(Sharing::Mps { replicas: 4 }),
        };
        let v = parser_rule_violations(&mps.render(), &PluginEnv::with_mig_strategy("mixed"), false);
        assert_eq!(
            v,
            ["using --mig-strategy=mixed is not supported with MPS (main.go validateFlags)"]
        );
        let mig = NodeConfig {
            mig: true,
            sharing: None,
        };
        for env in ["single", "none"] {
            let v = parser_rule_violations(&mig.render(), &PluginEnv::with_mig_strategy(env), true);
            assert_eq!(v.len(), 1, "{env}: {v:?}");
        }
        // Every strategy breaks one mode or another: there is no one value for the environment.
        for env in ["none", "single", "mixed"] {
            let broken = all_configs()
                .iter()
                .filter(|c| !parser_rule_violations(&c.render(), &PluginEnv::with_mig_strategy(env), c.mig).is_empty())
                .count();
            assert!(broken > 0, "MIG_STRATEGY={env} starts every mode");
        }
    }

    /// The config of a node with no plan is refused by the plugin in any environment, through a
    /// rule GPU feature discovery does not check; it parses as the plugin's config format.
    #[test]
    fn the_unplanned_config_is_refused_by_the_plugin() {
        let c: PluginConfig = serde_saphyr::from_str(UNPLANNED_CONFIG).unwrap();
        assert_eq!(c.version, "v1");
        for env in [PluginEnv::documented(), PluginEnv::with_mig_strategy("single")] {
            for mig in [false, true] {
                let v = parser_rule_violations(&c, &env, mig);
                assert!(v.iter().any(|m| m.starts_with("invalid IMEX channel IDs")), "{v:?}");
            }
        }
    }

    /// The rule checker catches each rule broken on purpose (so it can fail).
    #[test]
    fn each_rule_can_fail() {
        let mut bad = NodeConfig {
            mig: true,
            sharing: Some(Sharing::Mps { replicas: 1 }),
        }
        .render();
        bad.version = "v2".into();
        bad.sharing.as_mut().unwrap().mps.as_mut().unwrap().resources[0].name = "nvidia.com/GPU_x".into();
        let v = parser_rule_violations(&bad, &PluginEnv::documented(), true);
        assert_eq!(v.len(), 5, "{v:?}");
        bad.flags.mig_strategy = Some("some".into());
        assert!(
            parser_rule_violations(&bad, &PluginEnv::documented(), false)
                .iter()
                .any(|m| m.starts_with("unknown MIG strategy"))
        );
    }
}
