//! `gpu-tenancy crd`: the CRDs generated from the Rust types.

use crate::api::crds;
use std::path::Path;

/// File name of a CRD in `crds/`: `<plural>.<group>.yaml`.
pub fn file_name(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// Prints all CRDs as one YAML stream, or writes one file per CRD into `out_dir`.
pub fn run(out_dir: Option<&Path>) -> i32 {
    let Some(dir) = out_dir else {
        print!("{}", crate::api::crds_yaml());
        return 0;
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return 2;
    }
    for crd in crds() {
        let path = dir.join(file_name(&crd));
        let yaml = serde_saphyr::to_string(&crd).expect("a CRD always serialises");
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return 2;
        }
        eprintln!("wrote {}", path.display());
    }
    0
}
