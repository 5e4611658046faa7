//! GPU models and their MIG profiles (docs/nvidia.md#mig-geometry).
//!
//! These tables serve offline validation, planning and the simulated NVML library. A node agent
//! reads profile IDs and placements from the driver instead: other parts number them differently.

/// The seven GPU-instance shapes of every MIG-capable GPU modelled here. The discriminant order is
/// the NVML enum order of docs/nvidia.md#mig-geometry (not the profile ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    OneSlice,
    OneSliceMe,
    OneSliceDouble,
    TwoSlice,
    ThreeSlice,
    FourSlice,
    SevenSlice,
}

/// Geometry of a shape: the same on A100, H100, H100 NVL, H200 and B200.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeInfo {
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum value passed to `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub nvml_profile_enum: u32,
    /// Profile ID the driver reports in `info.id` and takes in placement/create/list calls.
    pub profile_id: u32,
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub max_instances: u32,
    /// Memory slices an instance of this shape may start at.
    pub starts: &'static [u32],
}

impl Shape {
    pub const ALL: [Shape; 7] = [
        Shape::OneSlice,
        Shape::OneSliceMe,
        Shape::OneSliceDouble,
        Shape::TwoSlice,
        Shape::ThreeSlice,
        Shape::FourSlice,
        Shape::SevenSlice,
    ];

    pub const fn info(self) -> ShapeInfo {
        match self {
            Shape::OneSlice => ShapeInfo {
                nvml_profile_enum: 0,
                profile_id: 19,
                compute_slices: 1,
                memory_slices: 1,
                max_instances: 7,
                starts: &[0, 1, 2, 3, 4, 5, 6],
            },
            Shape::OneSliceMe => ShapeInfo {
                nvml_profile_enum: 7,
                profile_id: 20,
                compute_slices: 1,
                memory_slices: 1,
                max_instances: 1,
                starts: &[0, 1, 2, 3, 4, 5, 6],
            },
            Shape::OneSliceDouble => ShapeInfo {
                nvml_profile_enum: 9,
                profile_id: 15,
                compute_slices: 1,
                memory_slices: 2,
                max_instances: 4,
                starts: &[0, 2, 4, 6],
            },
            Shape::TwoSlice => ShapeInfo {
                nvml_profile_enum: 1,
                profile_id: 14,
                compute_slices: 2,
                memory_slices: 2,
                max_instances: 3,
                starts: &[0, 2, 4],
            },
            Shape::ThreeSlice => ShapeInfo {
                nvml_profile_enum: 2,
                profile_id: 9,
                compute_slices: 3,
                memory_slices: 4,
                max_instances: 2,
                starts: &[0, 4],
            },
            Shape::FourSlice => ShapeInfo {
                nvml_profile_enum: 3,
                profile_id: 5,
                compute_slices: 4,
                memory_slices: 4,
                max_instances: 1,
                starts: &[0],
            },
            Shape::SevenSlice => ShapeInfo {
                nvml_profile_enum: 4,
                profile_id: 0,
                compute_slices: 7,
                memory_slices: 8,
                max_instances: 1,
                starts: &[0],
            },
        }
    }

    pub fn from_profile_id(id: u32) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.info().profile_id == id)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Compute slices of every MIG-capable GPU here.
pub const COMPUTE_SLICES: u32 = 7;
/// Memory slices of every MIG-capable GPU here.
pub const MEMORY_SLICES: u32 = 8;

/// One PCI device ID of a model, with the name NVML reports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// PCI device ID without the vendor, e.g. `0x2330`.
    pub device_id: u16,
    pub name: &'static str,
}

/// A GPU model: the PCI devices that share one MIG profile table.
#[derive(Debug, PartialEq, Eq)]
pub struct GpuModel {
    /// Short name used in messages and tests, e.g. `H100-80GB`.
    pub key: &'static str,
    pub variants: &'static [Variant],
    /// Framebuffer memory in MiB as NVML reports it.
    pub memory_mib: u64,
    /// CUDA compute capability (NVIDIA's published table: Ampere A100 8.0, Hopper 9.0,
    /// Blackwell B200 10.0).
    pub compute_capability: (u32, u32),
    /// Profile names by [`Shape`] order.
    profile_names: [&'static str; 7],
    /// Instance memory NVIDIA publishes for this model, by memory slices: `(memory slices, MiB)`, from
    /// the `nvidia-smi mig -lgip` outputs in tests/data/nvidia-smi/ and docs/nvidia.md#mig-geometry. An instance's
    /// memory is its memory slices, so a figure holds for every profile with that many slices (1g
    /// and 1g+me; 1g.2x and 2g; 3g and 4g).
    published_memory_mib: &'static [(u32, u64)],
}

/// NVIDIA's PCI vendor ID, appended to device IDs in mig-parted's `device-filter`.
pub const NVIDIA_VENDOR_ID: u16 = 0x10DE;

pub static MODELS: &[GpuModel] = &[
    GpuModel {
        key: "A100-40GB",
        compute_capability: (8, 0),
        variants: &[
            Variant {
                device_id: 0x20B0,
                name: "NVIDIA A100-SXM4-40GB",
            },
            Variant {
                device_id: 0x20B1,
                name: "NVIDIA A100-PCIE-40GB",
            },
            Variant {
                device_id: 0x20F1,
                name: "NVIDIA A100-PCIE-40GB",
            },
            Variant {
                device_id: 0x20F6,
                name: "NVIDIA A800 40GB PCIe",
            },
        ],
        memory_mib: 40960,
        profile_names: [
            "1g.5gb",
            "1g.5gb+me",
            "1g.10gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
        ],
        // nvidia-smi mig -lgip in the MIG user guide (tests/data/nvidia-smi/a100-40gb-lgip.txt):
        // 4.75, 9.62, 19.50, 39.25 GiB.
        published_memory_mib: &[(1, 4864), (2, 9856), (4, 19968), (8, 40192)],
    },
    GpuModel {
        key: "A100-80GB",
        compute_capability: (8, 0),
        variants: &[
            Variant {
                device_id: 0x20B2,
                name: "NVIDIA A100-SXM4-80GB",
            },
            Variant {
                device_id: 0x20B5,
                name: "NVIDIA A100 80GB PCIe",
            },
            Variant {
                device_id: 0x20F3,
                name: "NVIDIA A800-SXM4-80GB",
            },
            Variant {
                device_id: 0x20F5,
                name: "NVIDIA A800 80GB PCIe",
            },
        ],
        memory_mib: 81920,
        profile_names: [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
        // 1g.10gb: 9856 MB (docs/nvidia.md#mig-geometry, MIG user guide).
        published_memory_mib: &[(1, 9856)],
    },
    GpuModel {
        key: "H100-80GB",
        compute_capability: (9, 0),
        variants: &[
            Variant {
                device_id: 0x2330,
                name: "NVIDIA H100 80GB HBM3",
            },
            Variant {
                device_id: 0x2331,
                name: "NVIDIA H100 PCIe",
            },
            Variant {
                device_id: 0x2322,
                name: "NVIDIA H800 PCIe",
            },
            Variant {
                device_id: 0x2324,
                name: "NVIDIA H800",
            },
        ],
        memory_mib: 81559,
        profile_names: [
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
        // nvidia-smi mig -lgip (docs/nvidia.md#mig-geometry): 1g.10gb 9.75 GiB, 1g.20gb 19.62 GiB, 3g.40gb 39.5 GiB,
        // 7g.80gb 79.25 GiB. 19.62 is printed with two decimals: 20096 MiB (19.625 GiB) is the one
        // multiple of 128 MiB that prints so, and every exact figure here is a multiple of 128 MiB.
        published_memory_mib: &[(1, 9984), (2, 20096), (4, 40448), (8, 81152)],
    },
    GpuModel {
        key: "H100-NVL",
        compute_capability: (9, 0),
        variants: &[
            Variant {
                device_id: 0x2321,
                name: "NVIDIA H100 NVL",
            },
            Variant {
                device_id: 0x233A,
                name: "NVIDIA H800 NVL",
            },
        ],
        memory_mib: 95830,
        profile_names: [
            "1g.12gb",
            "1g.12gb+me",
            "1g.24gb",
            "2g.24gb",
            "3g.47gb",
            "4g.47gb",
            "7g.94gb",
        ],
        // nvidia-smi mig -lgip (tests/data/nvidia-smi/h100-nvl-lgip.txt): 10.75, 21.62, 46.38, 93.12 GiB;
        // the same node's nvidia-smi lists those instances at 11008, 22144 and 47488 MiB.
        published_memory_mib: &[(1, 11008), (2, 22144), (4, 47488), (8, 95360)],
    },
    GpuModel {
        key: "H200",
        compute_capability: (9, 0),
        variants: &[
            Variant {
                device_id: 0x2335,
                name: "NVIDIA H200",
            },
            Variant {
                device_id: 0x233B,
                name: "NVIDIA H200 NVL",
            },
        ],
        memory_mib: 143771,
        profile_names: [
            "1g.18gb",
            "1g.18gb+me",
            "1g.35gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb",
        ],
        // nvidia-smi mig -lgip in mig-parted#120 (tests/data/nvidia-smi/h200-lgip.txt): 16.00, 32.25,
        // 69.50, 139.75 GiB.
        published_memory_mib: &[(1, 16384), (2, 33024), (4, 71168), (8, 143104)],
    },
    GpuModel {
        key: "B200",
        compute_capability: (10, 0),
        variants: &[Variant {
            device_id: 0x2901,
            name: "NVIDIA B200",
        }],
        memory_mib: 183359,
        profile_names: [
            "1g.23gb",
            "1g.23gb+me",
            "1g.45gb",
            "2g.45gb",
            "3g.90gb",
            "4g.90gb",
            "7g.180gb",
        ],
        // nvidia-smi mig -lgip in mig-parted#187 (tests/data/nvidia-smi/b200-lgip.txt): 20.50 and
        // 44.25 GiB; the 4- and 8-slice figures were not kept.
        published_memory_mib: &[(1, 20992), (2, 45312)],
    },
];

/// A profile of a given model: its shape, its model-specific name and its instances' memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    pub shape: Shape,
    pub name: &'static str,
    memory_mib: u64,
}

impl Profile {
    pub fn info(&self) -> ShapeInfo {
        self.shape.info()
    }

    /// Memory of an instance of this profile, in MiB; never above the GPU's memory. See
    /// [`GpuModel::profile_memory_mib`].
    pub fn memory_mib(&self) -> u64 {
        self.memory_mib
    }
}

/// Nominal memory of a profile name (`3g.40gb` → 40 GiB), in MiB.
///
/// For accounting only: a tenant's `limits.memory` counts a `3g.40gb` at 40 GiB (docs/concepts/planner.md), whatever
/// the model. It is not an instance's memory: `7g.80gb` names 80 GiB, more than an H100's 81559 MiB;
/// [`GpuModel::profile_memory_mib`] gives what an instance has.
pub fn nominal_memory_mib(profile: &str) -> Option<u64> {
    let gb = profile.split_once('.')?.1;
    let digits: String = gb.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<u64>().ok().map(|g| g * 1024)
}

impl GpuModel {
    pub fn profile(&self, name: &str) -> Option<Profile> {
        let i = self.profile_names.iter().position(|n| *n == name)?;
        Some(self.profile_for(Shape::ALL[i]))
    }

    pub fn profile_for(&self, shape: Shape) -> Profile {
        Profile {
            shape,
            name: self.profile_names[shape.index()],
            memory_mib: self.shape_memory_mib(shape),
        }
    }

    /// Memory of an instance of the profile `name` on this model, in MiB, or `None` for a profile
    /// the model does not have. Never above [`GpuModel::memory_mib`].
    ///
    /// Where NVIDIA publishes the figure (docs/nvidia.md#mig-geometry: nvidia-smi output), that figure. Otherwise it
    /// is derived from memory slices, `memory_mib × memory slices / 8` rounded down: an estimate, at
    /// most the GPU's memory, where a name-based figure would not be (`7g.80gb` names 80 GiB, an
    /// H100 has 81559 MiB). A node agent reads the real figure from the driver.
    pub fn profile_memory_mib(&self, name: &str) -> Option<u64> {
        self.profile(name).map(|p| p.memory_mib())
    }

    /// Memory of an instance of `shape` on this model, in MiB: see [`GpuModel::profile_memory_mib`].
    pub fn shape_memory_mib(&self, shape: Shape) -> u64 {
        let slices = shape.info().memory_slices;
        let published = self.published_memory_mib.iter().find(|(s, _)| *s == slices);
        let mib = match published {
            Some(&(_, mib)) => mib,
            None => self.memory_mib * u64::from(slices) / u64::from(MEMORY_SLICES),
        };
        mib.min(self.memory_mib)
    }

    pub fn profiles(&self) -> impl Iterator<Item = Profile> + '_ {
        Shape::ALL.into_iter().map(|s| self.profile_for(s))
    }

    pub fn profile_names(&self) -> &[&'static str] {
        &self.profile_names
    }

    /// The first variant's name, the model's usual NVML name.
    pub fn name(&self) -> &'static str {
        self.variants[0].name
    }

    /// PCI IDs with vendor as mig-parted and NVML write them, e.g. `0x233010DE`.
    pub fn pci_ids(&self) -> impl Iterator<Item = String> + '_ {
        self.variants.iter().map(|v| format_pci_id(v.device_id))
    }
}

pub fn format_pci_id(device_id: u16) -> String {
    format!("0x{device_id:04X}{NVIDIA_VENDOR_ID:04X}")
}

/// Parses `0x233010DE`, `0x2330`, `233010de` into the device ID `0x2330`.
pub fn parse_pci_id(s: &str) -> Option<u16> {
    let hex = s.trim().trim_start_matches("0x").trim_start_matches("0X");
    match hex.len() {
        4 => u16::from_str_radix(hex, 16).ok(),
        8 => {
            let full = u32::from_str_radix(hex, 16).ok()?;
            ((full & 0xFFFF) as u16 == NVIDIA_VENDOR_ID).then_some((full >> 16) as u16)
        }
        _ => None,
    }
}

/// The model of a PCI device ID (`0x233010DE` or `0x2330`).
pub fn model_by_pci_id(s: &str) -> Option<&'static GpuModel> {
    let id = parse_pci_id(s)?;
    MODELS.iter().find(|m| m.variants.iter().any(|v| v.device_id == id))
}

/// The model of an NVML name (`NVIDIA H100 80GB HBM3`), a product label (`NVIDIA-H100-80GB-HBM3`)
/// or a model key (`H100-80GB`). Case-insensitive.
pub fn model_by_name(s: &str) -> Option<&'static GpuModel> {
    let norm = |x: &str| x.trim().to_ascii_lowercase().replace([' ', '_'], "-");
    let wanted = norm(s);
    MODELS
        .iter()
        .find(|m| norm(m.key) == wanted || m.variants.iter().any(|v| norm(v.name) == wanted))
}

/// The name NVML reports for a PCI device ID, when modelled.
pub fn variant_name(device_id: u16) -> Option<&'static str> {
    MODELS
        .iter()
        .flat_map(|m| m.variants)
        .find(|v| v.device_id == device_id)
        .map(|v| v.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_ids_parse_with_and_without_vendor() {
        assert_eq!(parse_pci_id("0x233010DE"), Some(0x2330));
        assert_eq!(parse_pci_id("0x2330"), Some(0x2330));
        assert_eq!(parse_pci_id("233510de"), Some(0x2335));
        assert_eq!(parse_pci_id("0x23301002"), None, "not NVIDIA");
        assert_eq!(parse_pci_id("zz"), None);
        assert_eq!(model_by_pci_id("0x233510DE").unwrap().key, "H200");
        assert_eq!(format_pci_id(0x20B0), "0x20B010DE");
    }

    #[test]
    fn models_resolve_by_name_label_and_key() {
        assert_eq!(model_by_name("NVIDIA H100 80GB HBM3").unwrap().key, "H100-80GB");
        assert_eq!(model_by_name("NVIDIA-H100-80GB-HBM3").unwrap().key, "H100-80GB");
        assert_eq!(model_by_name("a100-40gb").unwrap().key, "A100-40GB");
        assert!(model_by_name("NVIDIA T4").is_none());
    }

    #[test]
    fn profile_names_are_model_specific() {
        let a100 = model_by_name("A100-40GB").unwrap();
        let h100 = model_by_name("H100-80GB").unwrap();
        assert_eq!(a100.profile("1g.10gb").unwrap().shape, Shape::OneSliceDouble);
        assert_eq!(h100.profile("1g.10gb").unwrap().shape, Shape::OneSlice);
        assert_eq!(h100.profile("3g.40gb").unwrap().info().profile_id, 9);
        assert_eq!(nominal_memory_mib("3g.40gb"), Some(40 * 1024));
        assert_eq!(nominal_memory_mib("1g.10gb+me"), Some(10 * 1024));
    }

    #[test]
    fn profile_memory_never_exceeds_the_gpu() {
        for model in MODELS {
            let mut by_slices = Vec::new();
            for p in model.profiles() {
                let mib = model.profile_memory_mib(p.name).unwrap();
                assert_eq!(mib, p.memory_mib());
                assert!(mib > 0, "{} {}", model.key, p.name);
                assert!(
                    mib <= model.memory_mib,
                    "{} {}: {mib} > {}",
                    model.key,
                    p.name,
                    model.memory_mib
                );
                if p.shape == Shape::SevenSlice {
                    // The whole GPU as one instance: at most its memory, and nearly all of it.
                    assert!(
                        mib <= model.memory_mib && mib >= model.memory_mib * 9 / 10,
                        "{}",
                        p.name
                    );
                }
                by_slices.push((p.info().memory_slices, mib));
            }
            by_slices.sort();
            assert!(
                by_slices.windows(2).all(|w| w[0].1 <= w[1].1),
                "{}: more memory slices, no less memory: {by_slices:?}",
                model.key
            );
            assert_eq!(model.profile_memory_mib("9g.99gb"), None);
        }
        // The name-based figure is above the GPU's memory here; the instance figure is not.
        let h100 = model_by_name("H100-80GB").unwrap();
        assert!(nominal_memory_mib("7g.80gb").unwrap() > h100.memory_mib);
        assert!(h100.profile_memory_mib("7g.80gb").unwrap() < h100.memory_mib);
    }

    /// GiB with two decimals, cut as nvidia-smi's `mig -lgip` column reads.
    fn gib(mib: u64) -> String {
        let hundredths = mib * 100 / 1024;
        format!("{}.{:02}", hundredths / 100, hundredths % 100)
    }

    /// The figures docs/nvidia.md#mig-geometry quotes from NVIDIA (nvidia-smi, the MIG user guide), written as
    /// NVIDIA prints them: an oracle that does not go through the table above.
    #[test]
    fn profile_memory_matches_nvidia_published_figures() {
        let mib = |model: &str, profile: &str| model_by_name(model).unwrap().profile_memory_mib(profile).unwrap();
        assert_eq!(mib("A100-40GB", "1g.5gb"), 4864);
        assert_eq!(mib("A100-80GB", "1g.10gb"), 9856);
        assert_eq!(gib(mib("H100-80GB", "1g.10gb")), "9.75");
        assert_eq!(gib(mib("H100-80GB", "1g.20gb")), "19.62");
        assert_eq!(gib(mib("H100-80GB", "3g.40gb")), "39.50");
        assert_eq!(gib(mib("H100-80GB", "7g.80gb")), "79.25");
        assert_eq!(gib(mib("H200", "1g.18gb")), "16.00");
        assert_eq!(mib("H100-NVL", "3g.47gb"), 47488);
        // Same memory slices, same memory.
        assert_eq!(mib("H100-80GB", "1g.10gb+me"), mib("H100-80GB", "1g.10gb"));
        assert_eq!(mib("H100-80GB", "2g.20gb"), mib("H100-80GB", "1g.20gb"));
        assert_eq!(mib("H100-80GB", "4g.40gb"), mib("H100-80GB", "3g.40gb"));
        // Not published here: derived from memory slices, rounded down.
        assert_eq!(mib("B200", "7g.180gb"), 183359);
        assert_eq!(mib("B200", "3g.90gb"), 183359 * 4 / 8);
    }

    #[test]
    fn every_device_id_belongs_to_one_model() {
        let mut ids: Vec<u16> = MODELS.iter().flat_map(|m| m.variants).map(|v| v.device_id).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}
