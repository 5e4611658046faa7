//! `make run`'s kubelet for a DRA node: there is no real kubelet in the demo, so this plays its
//! part for the DRA plugin only. It registers with the agent's registration socket, then every
//! second prepares the claims of the pods the scheduler bound to the node and marks them Running,
//! printing each pod it starts with the devices it got (the demo shows that log).
//!
//! Usage: `fake-kubelet NODE PLUGIN_ROOT` (KUBECONFIG from the environment), PLUGIN_ROOT holding
//! the agent's `plugins_registry/` and `plugins/` directories.

use gpu_tenancy::dra::DRIVER;
use gpu_tenancy_e2e::kubelet::{self, FakeKubelet, Synced};
use std::path::PathBuf;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, node, root] = args.as_slice() else {
        eprintln!("usage: fake-kubelet NODE PLUGIN_ROOT");
        std::process::exit(2);
    };
    let root = PathBuf::from(root);
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fake-kubelet: no cluster to talk to ({e}); set KUBECONFIG");
            std::process::exit(1);
        }
    };
    kubelet::register(&root.join(format!("plugins_registry/{DRIVER}-reg.sock"))).await;
    println!("kubelet {node}: the DRA plugin {DRIVER} is registered");
    let mut k = FakeKubelet::new(&client, node, &root.join(format!("plugins/{DRIVER}/dra.sock")));
    loop {
        for s in k.sync().await {
            match s {
                Synced::Started(run) => {
                    let devices: Vec<&String> = run.devices().collect();
                    println!(
                        "kubelet {node}: pod {}/{} Running with {}",
                        run.namespace,
                        run.name,
                        devices.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")
                    );
                }
                Synced::Refused {
                    namespace,
                    pod,
                    claim,
                    error,
                } => {
                    println!("kubelet {node}: pod {namespace}/{pod} not started: claim {claim} refused: {error}");
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
