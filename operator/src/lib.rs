//! gpu-tenancy: share GPUs between teams on Kubernetes.
