//! NVIDIA's own default mig-parted file is real input: every MIG layout it ships must be accepted
//! for each GPU model its `device-filter` names.

use gpu_tenancy::mig::{MODELS, model_by_pci_id, solve_named};
use gpu_tenancy::migparted::{MigPartedFile, expand_mig_devices};

const DEFAULT: &str = include_str!("data/mig-parted-config-default.yaml");

#[test]
fn every_filtered_combination_fits_its_models() {
    let file = MigPartedFile::parse(DEFAULT).unwrap();
    let mut checked = 0;
    let mut unmodelled = std::collections::BTreeSet::new();
    for (name, entries) in &file.mig_configs {
        for entry in entries {
            let (Some(filter), Some(devices)) = (&entry.device_filter, &entry.mig_devices) else {
                continue;
            };
            let profiles = expand_mig_devices(devices);
            for id in filter.ids() {
                match model_by_pci_id(&id) {
                    Some(model) => {
                        if let Err(e) = solve_named(model, &profiles) {
                            panic!("{name} on {id} ({}): {e}", model.key);
                        }
                        checked += 1;
                    }
                    None => {
                        unmodelled.insert(id);
                    }
                }
            }
        }
    }
    // 8 + 4 (all-1g.10gb), 1 (all-1g.35gb), and all-balanced's H200, H100 NVL, H100/A100-80GB, A100-40GB, B200 entries.
    assert_eq!(checked, 8 + 4 + 1 + 2 + 2 + 8 + 4 + 1, "unmodelled IDs: {unmodelled:?}");
    // GPUs with no profile table in docs/nvidia.md#mig-geometry: A30, GB200, GB300, B300, GH200, H100-96GB, H20, RTX PRO 6000.
    let expected = [
        "0x20B610DE",
        "0x20B710DE",
        "0x232910DE",
        "0x233D10DE",
        "0x234210DE",
        "0x234810DE",
        "0x294110DE",
        "0x2BB510DE",
        "0x318210DE",
        "0x31C210DE",
    ];
    assert_eq!(unmodelled.into_iter().collect::<Vec<_>>(), expected);
}

#[test]
fn every_unfiltered_combination_fits_the_models_that_name_its_profiles() {
    let file = MigPartedFile::parse(DEFAULT).unwrap();
    let mut checked = 0;
    for (name, entries) in &file.mig_configs {
        for entry in entries.iter().filter(|e| e.device_filter.is_none()) {
            let Some(devices) = &entry.mig_devices else { continue };
            let profiles = expand_mig_devices(devices);
            for model in MODELS
                .iter()
                .filter(|m| profiles.iter().all(|p| m.profile(p).is_some()))
            {
                // all-1g.10gb etc. are filtered; here each profile means the same shape on every model naming it.
                if let Err(e) = solve_named(model, &profiles) {
                    panic!("{name} on {}: {e}", model.key);
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} combinations matched a model");
}
