//! What the commands that run in a cluster share: a runtime, a client, the parameters of every
//! server-side apply, and the shutdown signal.

use kube::api::PatchParams;
use std::future::Future;

/// A server-side apply as `manager`, forced (this operator owns the fields it applies), with the
/// API server's unknown-field check off.
///
/// Why `fieldValidation=Ignore`: with the server's default (`Warn`) every apply body is parsed as
/// YAML twice, once to apply and once more, strictly, only to warn of unknown or duplicate fields;
/// that second parse was about 8% of the control plane's CPU for a GpuNode status write (profiled
/// on the API server of `e2e/`). Nothing here reads the warnings (kube-rs does not surface them),
/// and the bodies are typed objects serialised from the types the schemas come from (this crate's,
/// which the CRDs are generated from; k8s-openapi's for built-in kinds), so no warning could come
/// but from version skew, where the server prunes the unknown field in every mode alike.
pub fn apply_params(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force().validation_ignore()
}

/// Runs `f` with a client from the in-cluster service account or `KUBECONFIG`; one line and exit 2
/// when there is neither.
pub fn with_client<F, Fut>(f: F) -> i32
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: Future<Output = i32>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 2;
        }
    };
    runtime.block_on(async move {
        match kube::Client::try_default().await {
            Ok(client) => f(client).await,
            Err(e) => {
                eprintln!("error: no Kubernetes configuration (in-cluster service account or KUBECONFIG): {e}");
                2
            }
        }
    })
}

/// SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}
