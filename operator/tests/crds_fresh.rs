//! `crds/` must be exactly what `gpu-tenancy crd --out-dir crds` writes today.

use gpu_tenancy::api::crds;
use gpu_tenancy::cli::crd::file_name;
use std::path::PathBuf;

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let mut stale = Vec::new();
    for crd in crds() {
        let name = file_name(&crd);
        let want = serde_saphyr::to_string(&crd).unwrap();
        match std::fs::read_to_string(dir.join(&name)) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{name} differs")),
            Err(e) => stale.push(format!("{name}: {e}")),
        }
    }
    // crds/Kustomization makes the directory a kustomize base for deploy/ (tests/deploy_rbac.rs).
    let files = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name() != "Kustomization"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(files, 4, "crds/ should hold exactly the four CRDs");
    assert!(
        stale.is_empty(),
        "crds/ is stale ({}); run `make crds` and commit the result",
        stale.join(", ")
    );
}
