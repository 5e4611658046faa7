//! Stale bytes: memory that keeps a previous tenant's byte through a memset, a fault model for
//! testing that a scrub verifies every byte it cleared (`sim-ctl plant`).
//!
//! A stale byte sits at an offset of the memory a scrub of one device (a GPU or a MIG instance)
//! clears, counted in the order the scrub clears it: the first allocation it zeroes whole starts
//! at offset 0, the next one where that one ends. Reads and the verification kernel see the byte
//! whatever was written over it; it stays until `sim-ctl unplant` (a cell that does not hold what
//! is written is not repaired by a reset either).

pub use crate::state::StaleByte;
use crate::state::{MIB, Paths, SimState, update};

/// The stale bytes of one device, as (offset, value).
pub fn of(st: &SimState, gpu: u32, gi: Option<u32>) -> Vec<(u64, u8)> {
    st.stale
        .iter()
        .filter(|s| s.gpu == gpu && s.gpu_instance == gi)
        .map(|s| (s.offset, s.value))
        .collect()
}

/// Plants `value` at `offset` of the memory a scrub of GPU `gpu` (or of its instance at memory
/// slice `start`) clears, replacing a byte planted there before.
pub fn plant(paths: &Paths, gpu: u32, start: Option<u32>, offset: u64, value: u8) -> Result<(), String> {
    if value == 0 {
        return Err("--value 0 is what a scrub writes: plant a non-zero byte".into());
    }
    update(paths, |st| {
        let g = st.gpu(gpu).ok_or_else(|| format!("no GPU {gpu}"))?;
        let (gi, bytes) = match start {
            None if g.mig_current => {
                return Err(format!("GPU {gpu} is in MIG mode: name an instance with --start"));
            }
            None => (None, g.memory_mib * MIB),
            Some(s) => {
                let gi = g
                    .gis
                    .iter()
                    .find(|gi| gi.start == s)
                    .ok_or_else(|| format!("GPU {gpu} has no GPU instance starting at slice {s}"))?;
                (Some(gi.id), g.gi_memory_mib(gi) * MIB)
            }
        };
        if offset >= bytes {
            return Err(format!(
                "--offset {offset} is past the device's {bytes} bytes of memory: give a smaller offset"
            ));
        }
        st.stale
            .retain(|s| !(s.gpu == gpu && s.gpu_instance == gi && s.offset == offset));
        st.stale.push(StaleByte {
            gpu,
            gpu_instance: gi,
            offset,
            value,
        });
        Ok(())
    })?
}

/// Removes the stale bytes of GPU `gpu` (its instances' too), or of every GPU.
pub fn unplant(paths: &Paths, gpu: Option<u32>) -> Result<(), String> {
    update(paths, |st| st.stale.retain(|s| gpu.is_some_and(|g| g != s.gpu)))
}

/// `0xAB`, `171` or `0o253`: a byte for `--value`.
pub fn parse_byte(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let parsed = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u8::from_str_radix(h, 16)
    } else {
        t.parse::<u8>()
    };
    parsed.map_err(|_| format!("{s:?} is not a byte: give 0x01 to 0xFF or 1 to 255"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(name: &str, yaml: &str) -> (Paths, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("nvml-sim-stale-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sim.yaml");
        std::fs::write(&config, yaml).unwrap();
        let paths = Paths {
            state: dir.join("state.json"),
            config,
        };
        (paths, dir)
    }

    #[test]
    fn bytes_parse_in_hex_or_decimal_and_zero_is_refused() {
        assert_eq!(parse_byte("0xAB"), Ok(0xAB));
        assert_eq!(parse_byte("171"), Ok(171));
        assert!(parse_byte("0x100").is_err());
        assert!(parse_byte("ab").is_err());
        let (p, dir) = sim("zero", "gpus:\n- {model: \"NVIDIA H100 80GB HBM3\"}\n");
        assert!(plant(&p, 0, None, 0, 0).unwrap_err().contains("non-zero"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_plant_names_a_device_and_an_offset_inside_it() {
        let (p, dir) = sim(
            "place",
            "gpus:\n- {model: \"NVIDIA H100 80GB HBM3\"}\n- {model: \"NVIDIA H100 80GB HBM3\", mig: true}\n",
        );
        let bytes = 81559 * MIB;
        assert!(plant(&p, 0, None, bytes, 1).unwrap_err().contains("past the device's"));
        assert!(plant(&p, 2, None, 0, 1).unwrap_err().contains("no GPU 2"));
        assert!(plant(&p, 1, None, 0, 1).unwrap_err().contains("MIG mode"));
        assert!(plant(&p, 1, Some(0), 0, 1).unwrap_err().contains("no GPU instance"));
        plant(&p, 0, None, bytes - 1, 1).unwrap();
        plant(&p, 0, None, bytes - 1, 2).unwrap();
        let st = crate::state::read(&p).unwrap();
        assert_eq!(of(&st, 0, None), [(bytes - 1, 2)], "replaced, not added");
        unplant(&p, Some(1)).unwrap();
        assert_eq!(crate::state::read(&p).unwrap().stale.len(), 1, "another GPU's stay");
        unplant(&p, None).unwrap();
        assert!(crate::state::read(&p).unwrap().stale.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
