//! What the commands that run in a cluster share: a runtime, a client, and the shutdown signal.

use std::future::Future;

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
