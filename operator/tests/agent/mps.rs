//! The MPS daemon's supervision against a stand-in `nvidia-cuda-mps-control` on PATH that speaks
//! the stdin protocol, records every command and can be made to crash.

use crate::support::{Sim, write_exec};

/// `-d` starts a "daemon" (a sleeping process whose pid is in the pipe directory); without
/// arguments it reads commands from stdin, records them, and fails like the real client when no
/// daemon runs.
const STANDIN: &str = r#"#!/bin/sh
dir="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
log="$dir/standin.log"
pidf="$dir/nvidia-cuda-mps-control.pid"
if [ "$1" = "-d" ]; then
  mkdir -p "$dir"
  echo "start CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY" >> "$log"
  sleep 100000 </dev/null >/dev/null 2>&1 &
  echo $! > "$pidf"
  exit 0
fi
pid=$(cat "$pidf" 2>/dev/null)
state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
if [ -z "$pid" ] || [ -z "$state" ] || [ "$state" = Z ]; then
  echo "Cannot find MPS control daemon process" >&2
  exit 1
fi
while read -r cmd; do
  echo "$cmd" >> "$log"
  case "$cmd" in
    set_default_device_pinned_mem_limit*)
      if [ -f "$dir/refuse" ]; then echo "refused: $cmd" >&2; exit 1; fi ;;
  esac
  case "$cmd" in
    quit) kill "$pid"; rm -f "$pidf" ;;
    get_server_list) ;;
  esac
done
"#;

struct Mps {
    sim: Sim,
    pipe: std::path::PathBuf,
}

impl Mps {
    fn new(name: &str) -> Mps {
        let mut sim = Sim::new(name, &[r#"{model: "NVIDIA H100 80GB HBM3", count: 3}"#]);
        let bin = sim.file("bin");
        std::fs::create_dir_all(&bin).unwrap();
        write_exec(&bin.join("nvidia-cuda-mps-control"), STANDIN);
        sim.path_prefix = Some(bin);
        let pipe = sim.file("pipe");
        Mps { sim, pipe }
    }

    fn apply(&self, spec: &str) -> crate::support::Run {
        let pipe = self.pipe.to_str().unwrap().to_string();
        let logs = self.sim.file("logs");
        self.sim.apply_with(
            spec,
            &["--mps-pipe-dir", &pipe, "--mps-log-dir", logs.to_str().unwrap()],
        )
    }

    /// Commands recorded since the last call (start lines included).
    fn commands(&self) -> Vec<String> {
        let log = self.pipe.join("standin.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        text.lines().map(String::from).collect()
    }

    fn daemon_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.pipe.join("nvidia-cuda-mps-control.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        // The stand-in daemon this test started, if still there.
        if let Some(pid) = self.daemon_pid() {
            let _ = std::process::Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

const SPEC: &str = "  gpus:
  - {index: 0, mode: MPS, tenants: [alpha], mps: {maxClients: 4, activeThreadPercentage: 25, pinnedMemoryLimit: 20Gi}}
  - {index: 1, mode: MPS, tenants: [alpha], mps: {maxClients: 4, activeThreadPercentage: 50, pinnedMemoryLimit: 10Gi}}
  - {index: 2, mode: Exclusive, tenants: [beta]}
";

#[test]
fn the_mps_daemon_is_started_supervised_restarted_and_stopped() {
    let m = Mps::new("mps");
    let uuids: Vec<String> = m.sim.discover().gpus.iter().map(|g| g.uuid.clone()).collect();

    let run = m.apply(SPEC);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let cmds = m.commands();
    let start = cmds.iter().find(|c| c.starts_with("start")).expect("daemon started");
    assert!(
        start.contains(&format!("CUDA_VISIBLE_DEVICES={},{}", uuids[0], uuids[1])),
        "{start}"
    );
    for want in [
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_device_pinned_mem_limit 1 10240M",
    ] {
        assert!(cmds.iter().any(|c| c == want), "missing {want:?} in {cmds:?}");
    }
    let mps = run.status().mps.clone().unwrap();
    assert!(mps.running);
    assert_eq!(mps.gpus, uuids[..2]);
    let st = m.sim.state();
    assert_eq!(
        st.gpus.iter().map(|g| g.compute_mode).collect::<Vec<_>>(),
        [3, 3, 0],
        "EXCLUSIVE_PROCESS on MPS GPUs"
    );

    // Healthy and unchanged: only the health check.
    let run = m.apply(SPEC);
    assert_eq!(run.code(), Some(0));
    assert_eq!(m.commands(), ["get_server_list"]);

    // The daemon crashes: the next step restarts it and counts the restart.
    let pid = m.daemon_pid().unwrap();
    let _ = std::process::Command::new("kill").arg(pid.to_string()).status();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let run = m.apply(SPEC);
    let mps = run.status().mps.clone().unwrap();
    assert!(mps.running && mps.restarts == 1, "{mps:?}");
    assert!(m.commands().iter().any(|c| c.starts_with("start")));

    // No GPU needs MPS any more: a clean quit.
    let run = m.apply("  gpus:\n  - {index: 0, mode: Exclusive, tenants: [alpha]}\n  - {index: 1, mode: Exclusive, tenants: [alpha]}\n");
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    assert!(m.commands().iter().any(|c| c == "quit"));
    assert!(!run.status().mps.as_ref().unwrap().running);
    assert!(m.daemon_pid().is_none());
}

fn attach(m: &Mps, gpu: u32, pid: u32) {
    nvidia_ml_sim::ctl::attach(
        &m.sim.paths,
        &nvidia_ml_sim::ctl::Attach {
            gpu,
            pid,
            tenant: Some("alpha".into()),
            used_mib: 100,
            ..Default::default()
        },
    )
    .unwrap();
}

fn restarted(cmds: &[String]) -> bool {
    cmds.iter().any(|c| c == "quit" || c.starts_with("start"))
}

/// One daemon serves every MPS GPU and only a restart changes its GPU set; a restart ends the
/// service of every client. So while clients run, a new GPU waits (`MpsPending`), a removed one is
/// still served and not ready; new defaults go to the running daemon; once the clients end, the
/// daemon restarts with the new set.
#[test]
fn the_mps_daemon_is_never_restarted_under_running_clients() {
    let m = Mps::new("mps-clients");
    let uuids: Vec<String> = m.sim.discover().gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(m.apply(SPEC).code(), Some(0));
    m.commands();
    attach(&m, 0, 5000);

    // GPU 2 joins MPS: it waits, GPUs 0 and 1 keep their daemon.
    let three = SPEC.replace(
        "{index: 2, mode: Exclusive, tenants: [beta]}",
        "{index: 2, mode: MPS, tenants: [beta], mps: {maxClients: 4}}",
    );
    let run = m.apply(&three);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    let cmds = m.commands();
    assert!(!restarted(&cmds), "restarted under a client: {cmds:?}");
    let g2 = &run.status().gpus[2];
    assert_eq!(
        (g2.applied, g2.reason.map(|r| r.as_str())),
        (Some(false), Some("MpsPending")),
        "{:?}",
        g2.message
    );
    assert!(g2.message.as_deref().unwrap().contains("5000"), "{:?}", g2.message);
    assert_eq!(run.status().gpus[0].applied, Some(true));
    let mps = run.status().mps.clone().unwrap();
    assert!(mps.running);
    assert_eq!(mps.gpus, uuids[..2]);

    // New defaults for GPU 0, GPU 2 back out of MPS: sent to the running daemon, no restart.
    let more_memory = SPEC.replace("pinnedMemoryLimit: 20Gi", "pinnedMemoryLimit: 30Gi");
    let run = m.apply(&more_memory);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let cmds = m.commands();
    assert!(!restarted(&cmds), "restarted under a client: {cmds:?}");
    assert!(
        cmds.iter().any(|c| c == "set_default_device_pinned_mem_limit 0 30720M"),
        "{cmds:?}"
    );

    // GPU 1 leaves MPS while GPU 0 has a client: still served by the daemon, so not ready.
    let one = more_memory.replace(
        "{index: 1, mode: MPS, tenants: [alpha], mps: {maxClients: 4, activeThreadPercentage: 50, pinnedMemoryLimit: 10Gi}}",
        "{index: 1, mode: Exclusive, tenants: [alpha]}",
    );
    let run = m.apply(&one);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    assert!(!restarted(&m.commands()));
    let g1 = &run.status().gpus[1];
    assert_eq!(
        (g1.applied, g1.reason.map(|r| r.as_str())),
        (Some(false), Some("MpsPending")),
        "{:?}",
        g1.message
    );

    // The client ends: the daemon restarts with the new set.
    nvidia_ml_sim::ctl::detach(&m.sim.paths, 5000).unwrap();
    let run = m.apply(&three);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let cmds = m.commands();
    assert!(cmds.iter().any(|c| c == "quit"), "{cmds:?}");
    let start = cmds.iter().find(|c| c.starts_with("start")).expect("daemon started");
    assert!(start.contains(&uuids.join(",")), "{start}");
    assert_eq!(run.status().mps.clone().unwrap().gpus, uuids);
}

/// A default the daemon refuses is not applied: the MPS GPUs are not ready with the daemon's
/// answer, and the next apply sends it again (without a restart).
#[test]
fn a_setting_the_mps_daemon_refuses_is_not_applied() {
    let m = Mps::new("mps-refused");
    std::fs::create_dir_all(&m.pipe).unwrap();
    std::fs::write(m.pipe.join("refuse"), "").unwrap();
    let run = m.apply(SPEC);
    assert_eq!(run.code(), Some(1), "{}", run.stdout());
    for g in &run.status().gpus[..2] {
        assert_eq!(
            (g.applied, g.reason.map(|r| r.as_str())),
            (Some(false), Some("MpsPending")),
            "{:?}",
            g.message
        );
        assert!(g.message.as_deref().unwrap().contains("refused"), "{:?}", g.message);
    }
    assert_eq!(run.status().gpus[2].applied, Some(true));
    m.commands();

    std::fs::remove_file(m.pipe.join("refuse")).unwrap();
    let run = m.apply(SPEC);
    assert_eq!(run.code(), Some(0), "{}", run.stdout());
    let cmds = m.commands();
    assert!(!restarted(&cmds), "{cmds:?}");
    assert!(
        cmds.iter().any(|c| c == "set_default_device_pinned_mem_limit 0 20480M"),
        "{cmds:?}"
    );
}
