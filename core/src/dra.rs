//! The names the DRA mode's two sides share: the driver, the device attributes the agent
//! publishes and the DeviceClasses select on, the device taint, and per tenant the DeviceClass,
//! extended resource name and quota entry of each kind of device it holds. The agent's slices
//! (`agent::dra`) and the controller's classes and rules (`desired::dra`) both read them here, so
//! a class's selector always names the attributes the devices carry.

use crate::api::Mode;
use crate::device_plugin::resource_name;

/// This project's DRA driver name (a DNS subdomain, as Kubernetes requires); also the domain of
/// its device attributes (`device.attributes["gpu.gputenancy.io"].tenant` in CEL).
pub const DRIVER: &str = "gpu.gputenancy.io";

/// The device taint of a device not safe to hand over; its value says why.
pub const NOT_READY_TAINT: &str = "gputenancy.io/not-ready";

/// The device taint of an unhealthy device (an XID or ECC error, a GPU NVML cannot read); its
/// value is the `HealthReason`.
pub const UNHEALTHY_TAINT: &str = "gputenancy.io/unhealthy";

/// Device attributes (in the driver's domain).
pub mod attr {
    /// The tenant the GpuNode binds the device to (empty: none).
    pub const TENANT: &str = "tenant";
    /// The GPU's mode (`Mode::as_str`: `MIG`, `MPS`, `TimeSlicing`, `Exclusive`).
    pub const MODE: &str = "mode";
    /// A MIG instance's profile (`1g.10gb`).
    pub const PROFILE: &str = "profile";
    /// The GPU's NUMA node, for `matchAttribute` constraints.
    pub const NUMA_NODE: &str = "numaNode";
}

/// Domain of the per-tenant extended resource names (`<tenant>.gputenancy.io/mig-1g.10gb`).
pub const EXTENDED_RESOURCE_DOMAIN: &str = "gputenancy.io";

/// One kind of device a tenant holds on DRA nodes: what one DeviceClass of it selects.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    /// A whole GPU (Exclusive).
    Gpu,
    /// A MIG instance of this profile.
    Mig(String),
    /// A share of an MPS GPU.
    Mps,
    /// A share of a time-sliced GPU.
    TimeSlicing,
}

impl DeviceKind {
    pub fn of(mode: Mode, profile: Option<&str>) -> DeviceKind {
        match mode {
            Mode::Exclusive => DeviceKind::Gpu,
            Mode::Mig => DeviceKind::Mig(profile.unwrap_or_default().to_string()),
            Mode::Mps => DeviceKind::Mps,
            Mode::TimeSlicing => DeviceKind::TimeSlicing,
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            DeviceKind::Gpu => Mode::Exclusive,
            DeviceKind::Mig(_) => Mode::Mig,
            DeviceKind::Mps => Mode::Mps,
            DeviceKind::TimeSlicing => Mode::TimeSlicing,
        }
    }

    /// The name NVIDIA's device plugin serves this kind under (`nvidia.com/mig-1g.10gb`).
    pub fn device_plugin_resource(&self) -> String {
        match self {
            DeviceKind::Mig(p) => resource_name(Mode::Mig, Some(p)),
            other => resource_name(other.mode(), None),
        }
    }

    /// The kind in a name: `gpu`, `mps`, `timeslicing`, `mig-1g.10gb` (a profile's `+` becomes
    /// `.`: names allow no `+`).
    fn part(&self) -> String {
        match self {
            DeviceKind::Gpu => "gpu".into(),
            DeviceKind::Mig(p) => format!("mig-{}", p.replace('+', ".")),
            DeviceKind::Mps => "mps".into(),
            DeviceKind::TimeSlicing => "timeslicing".into(),
        }
    }

    /// The DeviceClass of `tenant`'s devices of this kind: `<tenant>.<kind>.gputenancy.io`.
    pub fn class_name(&self, tenant: &str) -> String {
        format!("{tenant}.{}.{EXTENDED_RESOURCE_DOMAIN}", self.part())
    }

    /// The extended resource name that class serves pods under, written the way the device
    /// plugin's are: `<tenant>.gputenancy.io/gpu`, `.../mig-1g.10gb`, `.../mps`, `.../timeslicing`.
    pub fn extended_resource(&self, tenant: &str) -> String {
        format!("{tenant}.{EXTENDED_RESOURCE_DOMAIN}/{}", self.part())
    }

    /// The CEL selector of the class: this driver's devices bound to `tenant`, of this kind.
    pub fn selector(&self, tenant: &str) -> String {
        let a = |name: &str| format!("device.attributes['{DRIVER}'].{name}");
        let mut out = format!(
            "device.driver == '{DRIVER}' && {} == '{tenant}' && {} == '{}'",
            a(attr::TENANT),
            a(attr::MODE),
            self.mode().as_str()
        );
        if let DeviceKind::Mig(p) = self {
            out.push_str(&format!(" && {} == '{p}'", a(attr::PROFILE)));
        }
        out
    }
}

/// The ResourceQuota entry that limits the devices a namespace's claims take from `class`.
pub fn claim_quota_key(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are valid where Kubernetes puts them: a class name and a quota key prefix are
    /// DNS subdomains, an extended resource name a qualified name (its quota key too).
    #[test]
    fn names_are_valid_kubernetes_names() {
        let subdomain = regex_lite("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
        for kind in [
            DeviceKind::Gpu,
            DeviceKind::Mig("1g.10gb".into()),
            DeviceKind::Mig("1g.10gb+me".into()),
            DeviceKind::Mps,
            DeviceKind::TimeSlicing,
        ] {
            let class = kind.class_name("team-a");
            assert!(subdomain(&class) && class.len() <= 253, "{class}");
            let key = claim_quota_key(&class);
            let (prefix, name) = key.split_once('/').unwrap();
            assert!(subdomain(prefix) && name == "devices", "{key}");
            let ext = kind.extended_resource("team-a");
            let (prefix, name) = ext.split_once('/').unwrap();
            assert!(subdomain(prefix), "{ext}");
            assert!(name.len() <= 63 && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        }
        assert_eq!(
            DeviceKind::Mig("3g.40gb".into()).class_name("a"),
            "a.mig-3g.40gb.gputenancy.io"
        );
        assert_eq!(
            DeviceKind::Mig("3g.40gb".into()).extended_resource("a"),
            "a.gputenancy.io/mig-3g.40gb"
        );
        assert_eq!(
            DeviceKind::Mig("3g.40gb".into()).device_plugin_resource(),
            "nvidia.com/mig-3g.40gb"
        );
        assert_eq!(DeviceKind::Mps.device_plugin_resource(), "nvidia.com/gpu.shared");
    }

    fn regex_lite(pattern: &'static str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).unwrap();
        move |s| re.is_match(s)
    }
}
