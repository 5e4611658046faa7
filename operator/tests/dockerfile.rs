//! The image builds the workspace: Cargo reads every member's manifest even when it builds only
//! `gpu-tenancy`, so the Dockerfile must copy each member into the build context (a member added
//! later, such as `core/`, once broke `docker build` without any test noticing).

use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The workspace's members, from the root manifest's `members = [...]` line.
fn members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("Cargo.toml names its workspace members on one line");
    let list = &line[line.find('[').expect("members = [...]") + 1..line.rfind(']').expect("members = [...]")];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn the_image_copies_every_workspace_member() {
    let dockerfile = read("Dockerfile");
    let ignored = read(".dockerignore");
    let members = members();
    assert!(members.len() >= 5, "members read from Cargo.toml: {members:?}");
    for m in &members {
        assert!(
            dockerfile.lines().any(|l| l.trim() == format!("COPY {m} {m}")),
            "Dockerfile: no `COPY {m} {m}`: the workspace member {m} is missing from the image's build"
        );
        assert!(
            !ignored.lines().any(|l| l.trim().trim_end_matches('/') == m.as_str()),
            ".dockerignore: the workspace member {m} is ignored, so the image cannot build it"
        );
    }
}
