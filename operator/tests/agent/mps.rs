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
    fn new() -> Mps {
        let mut sim = Sim::new("mps", &[r#"{model: "NVIDIA H100 80GB HBM3", count: 3}"#]);
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
    let m = Mps::new();
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
