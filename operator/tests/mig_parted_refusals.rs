//! `import --from mig-parted` on files NVIDIA's mig-parted refuses: one line naming the config, the
//! entry and the field, exit 1, nothing imported.

use std::path::PathBuf;
use std::process::Command;

fn import(name: &str, text: &str) -> (Option<i32>, String, String) {
    let dir = std::env::temp_dir().join(format!("gt-mig-parted-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpu-tenancy"))
        .args(["import", "--from", "mig-parted", path.to_str().unwrap()])
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).replace(path.to_str().unwrap(), name),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn refusals_name_config_entry_and_field() {
    let cases = [
        (
            "mig-on-without-devices.yaml",
            "version: v1\nmig-configs:\n  all-1g:\n  - {devices: all, mig-enabled: false}\n  - {devices: [0, 1], mig-enabled: true}\n",
            "mig-on-without-devices.yaml: mig-parted: -: config \"all-1g\" entry 1: mig-devices: required when mig-enabled is true; `{}` is MIG on with no instances\n",
        ),
        (
            "bad-profile.yaml",
            "version: v1\nmig-configs:\n  custom:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {3g.40gb: 1, 3g40gb: 1}\n",
            "bad-profile.yaml: mig-parted: -: config \"custom\" entry 0: mig-devices[\"3g40gb\"]: not a MIG profile name: \"3g40gb\" is not <g>g.<gb>gb or <c>c.<g>g.<gb>gb\n",
        ),
        (
            "v2.yaml",
            "version: v2\nmig-configs: {}\n",
            "v2.yaml: mig-parted: -: version \"v2\" is not supported; mig-parted files say `version: v1`\n",
        ),
    ];
    for (name, text, expected) in cases {
        let (code, out, err) = import(name, text);
        assert_eq!(code, Some(1), "{name}: {out}{err}");
        assert_eq!(out, expected);
        assert!(!err.contains("imported"), "{err}");
    }
}
