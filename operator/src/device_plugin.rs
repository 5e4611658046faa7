//! NVIDIA's device plugin, as this operator configures it: the resource names it advertises, the
//! one-sharing-setting-per-node rule, and the per-node config it reads (FACTS.md §3).
//!
//! The plugin applies one sharing setting to every whole (non-MIG) GPU of a node: `rename` and
//! `devices` on a sharing resource are parsed and dropped (k8s-device-plugin#1786). It refuses MPS
//! on a node with MIG devices ("sharing using MPS is not supported for MIG devices",
//! `internal/plugin/mps.go`). Both rules live here, once: plans are checked with [`node_config`]
//! and the controller renders what the same function returns.

use crate::api::{GpuGroup, GpuSpec, Mode};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Whole GPUs, one per request.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Replicas of a shared (MPS or time-sliced) GPU: `renameByDefault: true` advertises them under
/// this name, so a quota can tell a share from a whole GPU.
pub const RESOURCE_SHARED: &str = "nvidia.com/gpu.shared";
/// Prefix of the `mixed` MIG strategy's resource names (`nvidia.com/mig-3g.40gb`).
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// The resource name of a MIG profile under the `mixed` strategy.
pub fn mig_resource(profile: &str) -> String {
    format!("{MIG_RESOURCE_PREFIX}{profile}")
}

/// The resource name a grant of `mode` (and MIG `profile`) is used through: `nvidia.com/gpu` for
/// whole GPUs, `nvidia.com/gpu.shared` for MPS and time-slicing shares (the plugin ignores a
/// `rename`, so both modes share it), `nvidia.com/mig-<profile>` for MIG instances.
pub fn resource_name(mode: Mode, profile: Option<&str>) -> String {
    match mode {
        Mode::Mig => mig_resource(profile.unwrap_or_default()),
        Mode::Exclusive => RESOURCE_GPU.into(),
        Mode::Mps | Mode::TimeSlicing => RESOURCE_SHARED.into(),
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
    pub fn of(mode: Mode, mps_clients: Option<u32>, replicas: Option<u32>) -> Option<Sharing> {
        match mode {
            Mode::Mig => None,
            Mode::Exclusive => Some(Sharing::Exclusive),
            Mode::Mps => Some(Sharing::Mps {
                replicas: mps_clients.unwrap_or(crate::api::MpsSettings::default().max_clients),
            }),
            Mode::TimeSlicing => Some(Sharing::TimeSlicing {
                replicas: replicas.unwrap_or(0),
            }),
        }
    }

    pub fn of_group(g: &GpuGroup) -> Option<Sharing> {
        Sharing::of(
            g.mode,
            g.mps.as_ref().map(|m| m.max_clients),
            g.time_slicing.as_ref().map(|t| t.replicas),
        )
    }

    pub fn of_gpu(g: &GpuSpec) -> Option<Sharing> {
        Sharing::of(
            g.mode,
            g.mps.as_ref().map(|m| m.max_clients),
            g.time_slicing.as_ref().map(|t| t.replicas),
        )
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
                mig_strategy: if self.mig { "mixed" } else { "none" }.into(),
            },
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
    pub flags: Flags,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingConfig>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    pub mig_strategy: String,
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

/// The plugin's own parser rules (k8s-device-plugin `api/config/v1` at 1b826ac, FACTS.md §3), as an
/// independent check of what [`NodeConfig::render`] writes: one message per broken rule.
pub fn parser_rule_violations(config: &PluginConfig) -> Vec<String> {
    let mut out = Vec::new();
    if !(config.version.is_empty() || config.version == "v1") {
        out.push(format!("unknown version {:?}", config.version));
    }
    if !["none", "single", "mixed"].contains(&config.flags.mig_strategy.as_str()) {
        out.push(format!("unknown migStrategy {:?}", config.flags.mig_strategy));
    }
    let Some(sharing) = &config.sharing else { return out };
    for (what, res) in [("mps", &sharing.mps), ("timeSlicing", &sharing.time_slicing)] {
        let Some(res) = res else { continue };
        if res.resources.is_empty() {
            out.push(format!("sharing.{what}.resources must be present and non-empty"));
        }
        for r in &res.resources {
            if r.replicas < 2 {
                out.push(format!(
                    "sharing.{what}: replicas of {} must be >= 2, not {}",
                    r.name, r.replicas
                ));
            }
            let full = if r.name.contains('/') {
                r.name.clone()
            } else {
                format!("nvidia.com/{}", r.name)
            };
            let part = full.strip_prefix("nvidia.com/").unwrap_or("");
            let dns_subdomain = !part.is_empty()
                && part.len() <= 253
                && part.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !full.starts_with("nvidia.com/") || !dns_subdomain || full.len() > 63 {
                out.push(format!("sharing.{what}: {:?} is not a valid resource name", r.name));
            }
        }
    }
    if sharing.mps.as_ref().is_some_and(|m| !m.resources.is_empty()) && config.flags.mig_strategy != "none" {
        out.push("sharing using MPS is not supported for MIG devices".into());
    }
    out
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

    /// Every config the renderer can produce passes the plugin's own parser rules, and the rule
    /// checker catches each rule broken on purpose (so it can fail).
    #[test]
    fn rendered_configs_pass_the_plugins_parser_rules() {
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
        for c in &configs {
            let rendered = c.render();
            assert_eq!(parser_rule_violations(&rendered), Vec::<String>::new(), "{}", c.key());
            let text = serde_saphyr::to_string(&rendered).unwrap();
            let back: PluginConfig = serde_saphyr::from_str(&text).unwrap();
            assert_eq!(back, rendered);
        }
        let mut bad = NodeConfig {
            mig: true,
            sharing: Some(Sharing::Mps { replicas: 1 }),
        }
        .render();
        bad.version = "v2".into();
        bad.sharing.as_mut().unwrap().mps.as_mut().unwrap().resources[0].name = "nvidia.com/GPU_x".into();
        let v = parser_rule_violations(&bad);
        assert_eq!(v.len(), 4, "{v:?}");
    }
}
