//! End-to-end tests against a real API server: run with `make e2e` (see e2e/run.sh).
//! Without GPU_TENANCY_E2E_KUBECONFIG every test fails, saying how to run it.

mod agent_access;
mod bounds;
mod controlplane;
mod crds;
mod deploy;
mod desired;
mod fixtures;
mod gitops;
mod leader;
mod printer_columns;
mod privilege;
mod status;
mod validation;
