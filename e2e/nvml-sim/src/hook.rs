//! The driver's side of the container toolkit's `apply-cuda-memory-limits` hook, for the
//! `sim-nvidia-ctk` stand-in: what a `createRuntime` OCI hook is given (the container's state on
//! stdin, its bundle's `config.json`), the two variables it reads from the container's
//! environment, and the cap it leaves in the simulated driver ([`crate::caps`]).

use crate::caps::{CapError, MemoryCap};
use crate::state::{Paths, update};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The memory the container may count on, in whole MiB (recorded with the cap).
pub const REQUEST_ENV: &str = "NVIDIA_GPU_MEMORY_REQUEST";
/// The memory past which the container's allocations fail, in whole MiB.
pub const LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";

/// The state an OCI runtime hands a hook on stdin (runtime-spec `state`): the fields the hook
/// uses.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct OciState {
    pub id: String,
    #[serde(default)]
    pub pid: Option<i64>,
    pub bundle: PathBuf,
}

#[derive(Deserialize)]
struct OciSpec {
    #[serde(default)]
    process: Option<OciProcess>,
}

#[derive(Deserialize)]
struct OciProcess {
    #[serde(default)]
    env: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("the OCI state on stdin is not valid: {0} (an OCI runtime passes {{\"id\", \"pid\", \"bundle\", ...}})")]
    State(serde_json::Error),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid OCI spec: {source}")]
    Spec { path: PathBuf, source: serde_json::Error },
    #[error("{name}={value:?} in the container's environment is not a whole positive number of MiB")]
    Malformed { name: &'static str, value: String },
    #[error("{name} is set twice in the container's environment ({first:?}, {second:?}): refusing to pick one")]
    Ambiguous {
        name: &'static str,
        first: String,
        second: String,
    },
    #[error("{REQUEST_ENV}={request} is above {LIMIT_ENV}={limit}: the request cannot exceed the limit")]
    RequestAboveLimit { request: u64, limit: u64 },
    #[error("--driver-root {0} is not a directory: the driver's libraries are not there")]
    DriverRoot(PathBuf),
    #[error("the simulated driver refused the cap: {0}")]
    Driver(#[from] CapError),
}

/// The two variables as the container's spec sets them: `None` when neither is set (the hook
/// then does nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub request_mib: Option<u64>,
    pub limit_mib: u64,
}

/// Reads the variables from `env` (`KEY=VALUE` entries). With only a request, the limit is the
/// request: the container stays bounded rather than unbounded.
pub fn limits_of(env: &[String]) -> Result<Option<Limits>, HookError> {
    let request = var(env, REQUEST_ENV)?;
    let limit = var(env, LIMIT_ENV)?;
    let limit_mib = match (request, limit) {
        (None, None) => return Ok(None),
        (Some(r), None) => r,
        (_, Some(l)) => l,
    };
    if let Some(r) = request
        && r > limit_mib
    {
        return Err(HookError::RequestAboveLimit {
            request: r,
            limit: limit_mib,
        });
    }
    Ok(Some(Limits {
        request_mib: request,
        limit_mib,
    }))
}

fn var(env: &[String], name: &'static str) -> Result<Option<u64>, HookError> {
    let mut found: Option<&str> = None;
    for value in env.iter().filter_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')) {
        match found {
            Some(first) if first != value => {
                return Err(HookError::Ambiguous {
                    name,
                    first: first.to_string(),
                    second: value.to_string(),
                });
            }
            _ => found = Some(value),
        }
    }
    found
        .map(|v| match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(HookError::Malformed {
                name,
                value: v.to_string(),
            }),
        })
        .transpose()
}

/// The container's environment from `<bundle>/config.json`.
pub fn bundle_env(bundle: &Path) -> Result<Vec<String>, HookError> {
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| HookError::Read {
        path: path.clone(),
        source,
    })?;
    let spec: OciSpec = serde_json::from_str(&text).map_err(|source| HookError::Spec { path, source })?;
    Ok(spec.process.map(|p| p.env).unwrap_or_default())
}

/// The hook: for the container whose OCI state is `state_json`, caps its memory on `gpu_uuid` as
/// its spec asks. Returns the cap set, `None` when the spec asks for none.
pub fn apply_cuda_memory_limits(
    paths: &Paths,
    state_json: &str,
    driver_root: &Path,
    gpu_uuid: &str,
) -> Result<Option<MemoryCap>, HookError> {
    let state: OciState = serde_json::from_str(state_json).map_err(HookError::State)?;
    if !driver_root.is_dir() {
        return Err(HookError::DriverRoot(driver_root.to_path_buf()));
    }
    let Some(limits) = limits_of(&bundle_env(&state.bundle)?)? else {
        return Ok(None);
    };
    let cap = MemoryCap {
        gpu_uuid: gpu_uuid.to_string(),
        container: state.id,
        request_mib: limits.request_mib,
        limit_mib: limits.limit_mib,
    };
    update(paths, |st| st.set_cap(cap.clone()))
        .map_err(CapError::State)?
        .map_err(HookError::Driver)?;
    Ok(Some(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kvs: &[&str]) -> Vec<String> {
        kvs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_variables_are_read_as_whole_mib() {
        assert_eq!(limits_of(&env(&["PATH=/bin"])).unwrap(), None);
        assert_eq!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_REQUEST=100", "NVIDIA_GPU_MEMORY_LIMIT=200"])).unwrap(),
            Some(Limits {
                request_mib: Some(100),
                limit_mib: 200
            })
        );
        assert_eq!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_REQUEST=100"])).unwrap(),
            Some(Limits {
                request_mib: Some(100),
                limit_mib: 100
            }),
            "a request alone bounds the container"
        );
        assert_eq!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_LIMIT=7", "NVIDIA_GPU_MEMORY_LIMIT=7"])).unwrap(),
            Some(Limits {
                request_mib: None,
                limit_mib: 7
            })
        );
        assert_eq!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_LIMITS=7"])).unwrap(),
            None,
            "another variable"
        );
    }

    #[test]
    fn malformed_values_are_refused_by_name() {
        for (e, want) in [
            ("NVIDIA_GPU_MEMORY_LIMIT=10Gi", "NVIDIA_GPU_MEMORY_LIMIT=\"10Gi\""),
            ("NVIDIA_GPU_MEMORY_LIMIT=-1", "NVIDIA_GPU_MEMORY_LIMIT=\"-1\""),
            ("NVIDIA_GPU_MEMORY_LIMIT=0", "NVIDIA_GPU_MEMORY_LIMIT=\"0\""),
            ("NVIDIA_GPU_MEMORY_REQUEST=", "NVIDIA_GPU_MEMORY_REQUEST=\"\""),
        ] {
            let err = limits_of(&env(&[e])).unwrap_err().to_string();
            assert!(err.contains(want), "{e}: {err}");
        }
        assert!(matches!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_LIMIT=1", "NVIDIA_GPU_MEMORY_LIMIT=2"])),
            Err(HookError::Ambiguous { .. })
        ));
        assert!(matches!(
            limits_of(&env(&["NVIDIA_GPU_MEMORY_REQUEST=3", "NVIDIA_GPU_MEMORY_LIMIT=2"])),
            Err(HookError::RequestAboveLimit { request: 3, limit: 2 })
        ));
    }
}
