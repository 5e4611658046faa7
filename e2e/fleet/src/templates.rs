//! What each GPU model looks like to the agent, taken from one discovery of the simulated
//! `libnvidia-ml.so` (`e2e/nvml-sim`) through the production NVML path (`gpu-tenancy agent
//! discover`): names, PCI IDs, memory, and the MIG profiles with the IDs and placements the driver
//! reports. The in-memory backends copy these, so a fleet node reports what a real agent on the
//! simulator would.

use crate::backend::ModelTemplate;
use crate::generate::Model;
use gpu_tenancy::api::GpuNodeStatus;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Runs `gpu-tenancy agent discover -o json` on a simulated node with one GPU of each model and
/// returns each model's template. `dir` holds the simulator's config and state.
pub fn discover(gpu_tenancy: &Path, sim_lib: &Path, dir: &Path) -> Result<BTreeMap<Model, ModelTemplate>, String> {
    for (what, path, flag) in [
        ("the gpu-tenancy binary", gpu_tenancy, "--gpu-tenancy"),
        ("the simulated NVML library", sim_lib, "--nvml-sim"),
    ] {
        if !path.is_file() {
            return Err(format!(
                "{what} {} does not exist: build it (cargo build -p gpu-tenancy -p nvml-sim, --release for release paths) or point {flag} at it",
                path.display()
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let config = dir.join("models.sim.yaml");
    let state = dir.join("models.sim.state.json");
    let _ = std::fs::remove_file(&state);
    let gpus: Vec<String> = Model::ALL
        .iter()
        .map(|m| format!("- {{pciDeviceId: \"{}\", count: 1}}", m.pci_device_id()))
        .collect();
    std::fs::write(&config, format!("gpus:\n{}\n", gpus.join("\n")))
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let out = Command::new(gpu_tenancy)
        .args(["agent", "discover", "-o", "json"])
        .env("GPU_TENANCY_SIM_CONFIG", &config)
        .env("GPU_TENANCY_SIM_STATE", &state)
        .env("GPU_TENANCY_NVML_LIB", sim_lib)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", gpu_tenancy.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} agent discover on the simulator failed: {}",
            gpu_tenancy.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let status: GpuNodeStatus = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("agent discover printed something that is not a GpuNode status: {e}"))?;
    let driver = status
        .driver
        .clone()
        .ok_or("agent discover reported no driver versions")?;
    let mut out = BTreeMap::new();
    for (model, gpu) in Model::ALL.iter().zip(&status.gpus) {
        if !gpu.pci_device_id.eq_ignore_ascii_case(model.pci_device_id()) || gpu.profiles.is_empty() {
            return Err(format!(
                "agent discover reported GPU {} as {} ({}) with {} MIG profiles; expected {} with profiles",
                gpu.index,
                gpu.name,
                gpu.pci_device_id,
                gpu.profiles.len(),
                model.pci_device_id()
            ));
        }
        out.insert(
            *model,
            ModelTemplate {
                driver: driver.clone(),
                gpu: gpu.clone(),
            },
        );
    }
    if out.len() != Model::ALL.len() {
        return Err(format!(
            "agent discover reported {} GPUs, expected {}",
            status.gpus.len(),
            Model::ALL.len()
        ));
    }
    Ok(out)
}
