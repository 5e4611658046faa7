//! Requests made as someone else (impersonation), and what the API server answered: the least
//! privilege tests (tests/e2e/privilege.rs, tests/e2e/agent_access.rs, tests/controller/privilege.rs)
//! act as the operator's service accounts and a tenant's users this way.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::kubeconfig_path;

/// The groups the API server puts a service account of the operator's namespace in.
pub const OPERATOR_SA_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:gpu-tenancy-system",
    "system:authenticated",
];

/// A client acting as `user` in `groups`, with user extras `extra`, through the admin
/// kubeconfig's impersonation rights.
pub async fn impersonating(user: &str, groups: &[&str], extra: Option<HashMap<String, Vec<String>>>) -> Client {
    let path = kubeconfig_path();
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("reading kubeconfig {}: {e}", path.display()));
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading kubeconfig {}: {e}", path.display()));
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    config.auth_info.impersonate_user_extra = extra;
    Client::try_from(config).unwrap_or_else(|e| panic!("building a client impersonating {user}: {e}"))
}

/// The outcome of a request: Ok, or the API server's message with its code.
pub fn outcome<T>(r: Result<T, kube::Error>) -> Result<(), String> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(format!("{} ({})", s.message, s.code)),
        Err(e) => panic!("request failed without an API answer: {e}"),
    }
}

/// Retries `f` until `done` holds for its outcome (RBAC and admission policies reach the API
/// server's caches a moment after they are written), failing after 60 s with the last outcome.
pub async fn eventually<F, Fut>(what: &str, mut f: F, done: impl Fn(&Result<(), String>) -> bool) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        let r = f().await;
        if done(&r) {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: still {r:?} after 60s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
