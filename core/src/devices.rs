//! Device ranges of a plan's GPU groups (`all`, `0,2`, `4-7`, `0-3,6`): the one parser that policy
//! checks, the planner, mig-parted import/export and the command line share.

/// Highest GPU index a device list may name. NVML numbers a node's GPUs from 0; no node carries
/// more than 64, and the bound keeps `0-4000000000` from expanding into a huge list.
pub const MAX_DEVICE_INDEX: u32 = 63;

/// Why a device list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceListError {
    #[error("range {part:?} runs backwards; write {hi}-{lo}")]
    Backwards { part: String, lo: u32, hi: u32 },
    #[error("device index {index} is out of range (0-{MAX_DEVICE_INDEX})")]
    OutOfRange { index: u32 },
    #[error("{list:?} names a device twice")]
    Repeated { list: String },
    #[error("{list:?} is not a device list; write `all`, `0,2` or `4-7`")]
    NotAList { list: String },
}

/// Parses an explicit device list (`0,2`, `4-7`, `0-3,6`) into sorted, unique indices.
/// `all` is not a list: callers expand it with the node's GPU count ([`expand_devices`]).
pub fn parse_devices(spec: &str) -> Result<Vec<u32>, DeviceListError> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (parse_index(a, spec)?, parse_index(b, spec)?),
            None => {
                let i = parse_index(part, spec)?;
                (i, i)
            }
        };
        if lo > hi {
            return Err(DeviceListError::Backwards {
                part: part.to_string(),
                lo,
                hi,
            });
        }
        if hi > MAX_DEVICE_INDEX {
            return Err(DeviceListError::OutOfRange { index: hi });
        }
        out.extend(lo..=hi);
    }
    let n = out.len();
    out.sort_unstable();
    out.dedup();
    if out.len() != n {
        return Err(DeviceListError::Repeated { list: spec.to_string() });
    }
    Ok(out)
}

fn parse_index(s: &str, whole: &str) -> Result<u32, DeviceListError> {
    s.trim().parse().map_err(|_| DeviceListError::NotAList {
        list: whole.to_string(),
    })
}

/// Indices a group's `devices` names on a node with `count` GPUs.
pub fn expand_devices(spec: &str, count: u32) -> Result<Vec<u32>, DeviceListError> {
    if spec == "all" {
        Ok((0..count).collect())
    } else {
        parse_devices(spec)
    }
}

/// Writes indices back as a device list (`0,1,2,5`), the form [`parse_devices`] reads.
pub fn format_devices(indices: &[u32]) -> String {
    indices.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists() {
        assert_eq!(parse_devices("0-3,6").unwrap(), [0, 1, 2, 3, 6]);
        assert_eq!(parse_devices("4,5").unwrap(), [4, 5]);
        assert_eq!(parse_devices(" 1 , 0 ").unwrap(), [0, 1]);
        assert_eq!(expand_devices("all", 3).unwrap(), [0, 1, 2]);
        assert_eq!(expand_devices("2", 3).unwrap(), [2]);
        assert!(parse_devices("3-1").unwrap_err().to_string().contains("backwards"));
        assert!(parse_devices("0-2,2").unwrap_err().to_string().contains("twice"));
        assert!(
            parse_devices("x")
                .unwrap_err()
                .to_string()
                .contains("not a device list")
        );
        assert!(parse_devices("").unwrap_err().to_string().contains("not a device list"));
        assert!(
            parse_devices("all")
                .unwrap_err()
                .to_string()
                .contains("not a device list")
        );
        assert!(parse_devices("99").unwrap_err().to_string().contains("out of range"));
        assert!(parse_devices("63").is_ok());
    }

    #[test]
    fn formatted_lists_parse_back() {
        for list in [vec![0], vec![0, 1, 2, 5], vec![7, 63]] {
            assert_eq!(parse_devices(&format_devices(&list)).unwrap(), list);
        }
    }
}
