//! What a real agent (`gpu-tenancy agent run`) reads when it starts, counted in the control
//! plane's audit log: its watch's first event is for the GpuNode its first pass already read (or
//! created), and brings no second pass. A fleet joining at once made every agent read its GpuNode
//! and its Node twice, on the API server that was already the bottleneck (`make bench-fleet`).

use crate::support::*;
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::procs::SimAgent;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

/// The completed requests in the audit log after byte `offset` on GpuNode `name` (its status
/// too) with `verb`.
fn requests(log: &Path, offset: u64, name: &str, verb: &str) -> Vec<Value> {
    let mut f = std::fs::File::open(log).unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    f.seek(SeekFrom::Start(offset)).expect("seeking in the audit log");
    let mut text = String::new();
    f.read_to_string(&mut text).expect("reading the audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["verb"] == verb
                && e["objectRef"]["resource"] == "gpunodes"
                && e["objectRef"]["name"] == name
        })
        .collect()
}

fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// Long enough for the watch's first event to arrive and any pass it started to finish.
const SETTLE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_agent_reads_its_gpunode_once_when_it_creates_it_and_once_when_it_restarts() {
    let cleanup = Cleanup::new();
    let client = setup(&cleanup).await;
    let log = gpu_tenancy_e2e::kubeconfig_path().with_file_name("audit.log");
    assert!(
        log.is_file(),
        "{} is missing: this test reads the audit log that e2e/controlplane writes next to its kubeconfig (run it with e2e/run.sh)",
        log.display()
    );
    let name = "reads-0";
    let config = "gpus:\n- {pciDeviceId: \"0x233010DE\", count: 1}\n";
    // A poll far beyond the test, so every read counted comes from the start and the watch.
    let offset = log_len(&log);
    let mut agent = SimAgent::start_polling(&client, &cleanup, name, "reads", config, 600).await;
    // Waiting on the audit log, not on reads of the test's own that it would count.
    let deadline = Instant::now() + Duration::from_secs(30);
    while requests(&log, offset, name, "patch").is_empty() {
        assert!(Instant::now() < deadline, "the agent published no status within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(SETTLE).await;
    let gets = requests(&log, offset, name, "get").len();
    assert_eq!(
        gets, 1,
        "a new agent read GpuNode {name} {gets} times: once to find it missing is all (it created it, and the \
         watch's event for the created object is not a new spec)"
    );
    assert_eq!(
        requests(&log, offset, name, "create").len(),
        1,
        "the agent did not create its GpuNode once"
    );

    let offset = log_len(&log);
    agent.restart();
    tokio::time::sleep(SETTLE).await;
    let gets = requests(&log, offset, name, "get").len();
    assert_eq!(
        gets, 1,
        "a restarted agent read GpuNode {name} {gets} times: its first pass reads it, and the watch's first event \
         (the same generation) brings nothing new"
    );
    assert!(agent.is_running(), "the agent stopped");
}
