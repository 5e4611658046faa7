//! Random kills of agents and controllers (SIGKILL) during rollouts and tenant churn, for
//! `GPU_TENANCY_FAULTS_SECONDS` (20 by default; `make e2e-faults` runs several minutes). The seed
//! (`GPU_TENANCY_FAULTS_SEED`, else the clock) is printed so a run can be repeated. Afterwards
//! everything converges, and the auditor saw no violation throughout.

use crate::common::*;
use gpu_tenancy_e2e::Cleanup;
use gpu_tenancy_e2e::auditor::{AuditConfig, Auditor};
use gpu_tenancy_e2e::procs::ControllerProcess;
use serde_json::json;
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok().filter(|v| !v.trim().is_empty())?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
    )
}

#[tokio::test]
async fn d_random_kills_during_rollouts_and_churn_converge_without_violations() {
    let seconds = env_u64("GPU_TENANCY_FAULTS_SECONDS").unwrap_or(20);
    let seed = env_u64("GPU_TENANCY_FAULTS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1
    });
    eprintln!("chaos: {seconds} s of random kills, GPU_TENANCY_FAULTS_SEED={seed}");
    let mut rng = Rng(seed.max(1));
    let cleanup = Cleanup::new();
    let client = setup().await;
    let auditor = Auditor::start(&client, AuditConfig::default()).await;
    let tenants = ["ch-a", "ch-b", "ch-c"];
    for t in tenants {
        set_tenant(&client, &cleanup, t, &[("3g.40gb", 1), ("2g.20gb", 1)]).await;
    }
    let layouts = [two_3g(), one_3g_two_2g(), json!(["2g.20gb", "2g.20gb", "2g.20gb"])];
    let mut agents = mig_pool(&client, &cleanup, "ch", 3, layouts[0].clone()).await;
    let mut controllers = [
        ControllerProcess::start("chaos-a", 3),
        ControllerProcess::start("chaos-b", 3),
    ];
    wait_converged(&client, "ch", &layouts[0], Duration::from_secs(120)).await;

    let (mut agent_kills, mut controller_kills, mut plan_changes, mut tenant_changes) = (0, 0, 0, 0);
    let mut layout = 0;
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        match rng.below(4) {
            0 => {
                let a = &mut agents[rng.below(3) as usize];
                a.kill();
                agent_kills += 1;
            }
            1 => {
                let c = &mut controllers[rng.below(2) as usize];
                c.kill();
                controller_kills += 1;
            }
            2 => {
                layout = (layout + 1 + rng.below(2) as usize) % layouts.len();
                set_plan(&client, "ch", layouts[layout].clone()).await;
                plan_changes += 1;
            }
            _ => {
                let t = tenants[rng.below(3) as usize];
                let (g3, g2) = (rng.below(3) as u32, rng.below(4) as u32);
                set_tenant(&client, &cleanup, t, &[("3g.40gb", g3), ("2g.20gb", g2)]).await;
                tenant_changes += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1500))).await;
        // Whatever is down comes back after a while (a restarted pod), most of the time.
        for a in agents.iter_mut() {
            if !a.is_running() && rng.below(2) == 0 {
                a.restart();
            }
        }
        for c in controllers.iter_mut() {
            if !c.is_running() && rng.below(2) == 0 {
                c.restart();
            }
        }
    }
    for a in agents.iter_mut() {
        if !a.is_running() {
            a.restart();
        }
    }
    for c in controllers.iter_mut() {
        if !c.is_running() {
            c.restart();
        }
    }
    eprintln!(
        "MEASURE chaos {seconds} s (seed {seed}): {agent_kills} agent kills, {controller_kills} controller kills, {plan_changes} plan changes, {tenant_changes} tenant changes"
    );
    let took = wait_converged(&client, "ch", &layouts[layout], Duration::from_secs(180)).await;
    eprintln!("MEASURE chaos: converged {took:?} after the last kill");
    assert_consistent_now(&client, &auditor).await;
}
