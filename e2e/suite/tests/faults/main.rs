//! Faults survived, with the auditor (`gpu_tenancy_e2e::auditor`) checking the invariants (docs/design.md#invariants) throughout:
//! a controller leader killed mid-rollout, the API server and etcd stopped and started again with
//! their data, random kills of agents and controllers during rollouts and tenant churn, and an
//! agent whose NVML fails at random. Real `gpu-tenancy controller` and `gpu-tenancy agent run`
//! processes on simulated GPUs; `e2e/run.sh` gives this binary a control plane of its own and runs
//! the scenarios one at a time. `GPU_TENANCY_FAULTS_SECONDS` sets how long the random kills last.

// Named in the order they run (one at a time, by name): the auditor's self-test needs a cluster
// where no controller has written admission policies yet.
mod a_auditor;
mod b_leader;
mod c_apiserver;
mod common;
mod d_chaos;
mod e_nvml;
