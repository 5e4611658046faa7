//! Why Prepare refuses a claim: one type for every check (the devices, the pods the claim is
//! reserved for, their containers' memory caps), whose text the kubelet shows in the pod's events.

use std::fmt;

/// Why a claim is refused: the container does not start, and the kubelet tries again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NotAllocated,
    NoTenant {
        namespace: String,
    },
    UnknownDevice {
        device: String,
    },
    WrongTenant {
        device: String,
        owner: Option<String>,
        tenant: String,
    },
    NotReady {
        device: String,
        why: &'static str,
    },
    Unhealthy {
        device: String,
        why: String,
    },
    InUse {
        device: String,
        claim: String,
    },
    /// The tenant has `maxGpusPerPod` and the claim is reserved for no pod, so what the pod holds
    /// cannot be counted.
    NotReserved {
        tenant: String,
    },
    /// A pod the claim is reserved for holds more devices through all its claims than its
    /// tenant's `maxGpusPerPod`.
    TooManyForPod {
        pod: String,
        tenant: String,
        holds: u32,
        max: u32,
    },
    /// The claim's spec caps its container's memory, and it is reserved for no pod, so what else
    /// its containers consume cannot be told.
    CapNotReserved {
        claim: String,
    },
    /// A container of a pod the claim is reserved for also consumes another claim whose spec
    /// carries another memory cap (`other_cap`), or one that cannot be told (why): the runtime
    /// would apply one of the two to the GPUs of both (docs/concepts/isolation.md#memory-limits).
    CapsDiffer(Box<CapsDiffer>),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotAllocated => f.write_str(
                "the claim has no device of driver gpu.gputenancy.io allocated on this node; nothing to prepare here",
            ),
            Refusal::NoTenant { namespace } => write!(
                f,
                "namespace {namespace} belongs to no GpuTenant (none lists it alone), so its claims get no GPU device"
            ),
            Refusal::UnknownDevice { device } => write!(
                f,
                "device {device} is not one this node's GpuNode binds (the claim was allocated from a stale slice?)"
            ),
            Refusal::WrongTenant { device, owner, tenant } => write!(
                f,
                "device {device} is {}, not GpuTenant {tenant}'s, whose namespace the claim is in",
                match owner {
                    Some(o) => format!("GpuTenant {o}'s"),
                    None => "no tenant's".to_string(),
                }
            ),
            Refusal::NotReady { device, why } => {
                write!(
                    f,
                    "device {device} may not be handed over yet ({why}); the kubelet will retry"
                )
            }
            Refusal::Unhealthy { device, why } => write!(
                f,
                "device {device} is unhealthy ({why}); the claim needs another device: delete the pod so its claim is allocated again"
            ),
            Refusal::InUse { device, claim } => write!(f, "device {device} is prepared for claim {claim}"),
            Refusal::NotReserved { tenant } => write!(
                f,
                "GpuTenant {tenant} allows a pod a limited number of GPUs (spec.limits.maxGpusPerPod), and the claim is reserved for no pod, so what its pod holds cannot be counted"
            ),
            Refusal::TooManyForPod {
                pod,
                tenant,
                holds,
                max,
            } => write!(
                f,
                "pod {pod} holds {holds} devices of driver gpu.gputenancy.io through its claims (each claim a pod names counts, a name used twice twice, and the claims of its extended resources), and GpuTenant {tenant} allows at most {max} GPUs per pod (spec.limits.maxGpusPerPod)"
            ),
            Refusal::CapNotReserved { claim } => write!(
                f,
                "claim {claim} caps its container's GPU memory (NVIDIA_GPU_MEMORY_LIMIT), and it is reserved for no pod, so what else its containers consume cannot be checked"
            ),
            Refusal::CapsDiffer(d) => d.fmt(f),
        }
    }
}

/// A container of a pod `claim` is reserved for also consumes claim `other`, whose spec carries
/// another memory cap (`other_cap`), or one that cannot be told (why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapsDiffer {
    pub pod: String,
    pub container: String,
    pub claim: String,
    pub cap: u64,
    pub other: String,
    pub other_cap: Result<u64, String>,
}

impl fmt::Display for CapsDiffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let theirs = match &self.other_cap {
            Ok(mib) => format!("whose CDI spec caps it at {mib} MiB"),
            Err(why) => format!("whose memory cap cannot be told ({why})"),
        };
        write!(
            f,
            "container {} of pod {} consumes claim {}, whose CDI spec caps the container's GPU memory at {} MiB (NVIDIA_GPU_MEMORY_LIMIT), and claim {}, {theirs}; the container gets one value for all its GPUs, so one GPU could be capped above what its claim holds: use one claim with all the shares, or claims of shares of the same size",
            self.container, self.pod, self.claim, self.cap, self.other
        )
    }
}
