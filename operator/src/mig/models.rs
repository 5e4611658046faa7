//! GPU models and their MIG profiles (FACTS.md §1).
//!
//! These tables serve offline validation, planning and the simulated NVML library. A node agent
//! reads profile IDs and placements from the driver instead: other parts number them differently.

/// The seven GPU-instance shapes of every MIG-capable GPU modelled here. The discriminant order is
/// the NVML enum order of FACTS.md §1 (not the profile ID).
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
    /// Profile names by [`Shape`] order.
    profile_names: [&'static str; 7],
}

/// NVIDIA's PCI vendor ID, appended to device IDs in mig-parted's `device-filter`.
pub const NVIDIA_VENDOR_ID: u16 = 0x10DE;

pub static MODELS: &[GpuModel] = &[
    GpuModel {
        key: "A100-40GB",
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
    },
    GpuModel {
        key: "A100-80GB",
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
    },
    GpuModel {
        key: "H100-80GB",
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
    },
    GpuModel {
        key: "H100-NVL",
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
    },
    GpuModel {
        key: "H200",
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
    },
    GpuModel {
        key: "B200",
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
    },
];

/// A profile of a given model: its shape and its model-specific name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    pub shape: Shape,
    pub name: &'static str,
}

impl Profile {
    pub fn info(&self) -> ShapeInfo {
        self.shape.info()
    }

    /// Nominal memory from the profile name (`3g.40gb` is 40 GiB), in MiB.
    pub fn memory_mib(&self) -> u64 {
        nominal_memory_mib(self.name).unwrap_or(0)
    }
}

/// Nominal memory of a profile name (`3g.40gb` → 40 GiB), in MiB.
pub fn nominal_memory_mib(profile: &str) -> Option<u64> {
    let gb = profile.split_once('.')?.1;
    let digits: String = gb.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse::<u64>().ok().map(|g| g * 1024)
}

impl GpuModel {
    pub fn profile(&self, name: &str) -> Option<Profile> {
        let i = self.profile_names.iter().position(|n| *n == name)?;
        Some(Profile {
            shape: Shape::ALL[i],
            name: self.profile_names[i],
        })
    }

    pub fn profile_for(&self, shape: Shape) -> Profile {
        Profile {
            shape,
            name: self.profile_names[shape.index()],
        }
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

    /// `nvidia.com/gpu.product` label values GPU feature discovery gives nodes with this model.
    pub fn product_labels(&self) -> impl Iterator<Item = String> + '_ {
        self.variants.iter().map(|v| v.name.replace(' ', "-"))
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
    fn every_device_id_belongs_to_one_model() {
        let mut ids: Vec<u16> = MODELS.iter().flat_map(|m| m.variants).map(|v| v.device_id).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}
