//! The controller's HTTP endpoints, on `--metrics-addr` (default [`DEFAULT_ADDR`]):
//!
//! | path | answers |
//! |---|---|
//! | `GET /metrics` | the [`Metrics`] as OpenMetrics text |
//! | `GET /healthz` | 200 `ok` while the process serves requests (liveness probe) |
//! | `GET /readyz` | 200 `ok` once the watch caches have synced, else 503 and a one-line reason (readiness probe) |
//!
//! Readiness does not depend on leadership: a follower with synced caches is ready to take over at
//! once, and a Deployment whose followers are never ready would block its own rollouts.
//!
//! Plain hyper 1 over HTTP/1.1, no web framework: three fixed paths do not need routing.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::metrics::{self, Metrics};
use crate::runtime::backoff::Backoff;

/// The default of `--metrics-addr`.
pub const DEFAULT_ADDR: &str = "0.0.0.0:8080";

/// A client that opens a connection and sends nothing would otherwise hold it forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight (a scrape) before it drops them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

const TEXT: &str = "text/plain; charset=utf-8";

/// Listens on `addr`. The error names the address, so the command line can print it as it is.
pub async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} (--metrics-addr) for metrics and health checks: {e}"),
        )
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown` completes, then lets
/// requests in flight finish (up to 5 s). `ready` is true once the caches have synced.
/// Fails only when it cannot listen on `addr` (the error names it).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let listener = bind(addr).await?;
    serve_on(listener, metrics, ready, shutdown).await
}

/// [`serve`] on a listener bound beforehand, e.g. to `127.0.0.1:0` to learn the port from
/// `listener.local_addr()` (tests).
pub async fn serve_on(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    let graceful = GracefulShutdown::new();
    // Accept fails on a full file table (EMFILE) and the like: wait a little, growing, rather than
    // spin on an error that persists.
    let mut accept_backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_backoff.reset();
                    stream
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a metrics/health connection failed");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(accept_backoff.next()) => continue,
                    }
                }
            },
        };
        let (metrics, ready) = (metrics.clone(), ready.clone());
        let service = service_fn(move |req: Request<Incoming>| {
            let response = respond(req.method(), req.uri().path(), &metrics, &ready);
            async move { Ok::<_, Infallible>(response) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "metrics/health connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::debug!("metrics/health connections still open after {DRAIN_TIMEOUT:?}; dropping them");
    }
    Ok(())
}

/// The answer to `method path`: the whole routing table.
fn respond(method: &Method, path: &str, metrics: &Metrics, ready: &watch::Receiver<bool>) -> Response<Full<Bytes>> {
    if !matches!(*method, Method::GET | Method::HEAD) {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed; use GET\n"),
        );
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(metrics.encode())));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(metrics::CONTENT_TYPE));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if *ready.borrow() => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the watch caches have not synced yet\n".into(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            format!("{path} not found; try /metrics, /healthz or /readyz\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::metrics::WriteAction;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A plain HTTP/1.1 request over TCP: (status code, body).
    async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("send");
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
        let code = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status code");
        (code, body.to_owned())
    }

    struct Server {
        addr: SocketAddr,
        ready: watch::Sender<bool>,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<io::Result<()>>,
    }

    async fn start(metrics: Arc<Metrics>) -> Server {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (ready, ready_rx) = watch::channel(false);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, metrics, ready_rx, async {
            let _ = stop_rx.await;
        }));
        Server {
            addr,
            ready,
            stop,
            task,
        }
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics_then_stops() {
        let metrics = Arc::new(Metrics::new());
        let server = start(metrics.clone()).await;
        let addr = server.addr;

        assert_eq!(request(addr, "GET", "/healthz").await, (200, "ok\n".into()));
        let (code, body) = request(addr, "GET", "/readyz").await;
        assert_eq!(code, 503);
        assert_eq!(body.lines().count(), 1, "one-line reason: {body:?}");
        assert!(body.contains("not synced"), "{body}");

        server.ready.send(true).unwrap();
        assert_eq!(request(addr, "GET", "/readyz").await, (200, "ok\n".into()));

        metrics.written("GpuNode", WriteAction::Apply);
        metrics.pass(Duration::from_millis(12), true);
        let (code, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains(r#"gpu_tenancy_controller_objects_written_total{kind="GpuNode",action="apply"} 1"#),
            "{body}"
        );
        assert!(
            body.contains(r#"gpu_tenancy_controller_passes_total{result="ok"} 1"#),
            "{body}"
        );
        assert!(body.trim_end().ends_with("# EOF"));

        assert_eq!(request(addr, "GET", "/nope").await.0, 404);
        assert_eq!(request(addr, "POST", "/metrics").await.0, 405);
        let (code, body) = request(addr, "HEAD", "/healthz").await;
        assert_eq!((code, body.as_str()), (200, ""));

        server.stop.send(()).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), server.task).await;
        result.expect("stops after shutdown").unwrap().expect("no error");
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "no longer listening"
        );
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_does_not_block_shutdown_for_long() {
        let server = start(Arc::new(Metrics::new())).await;
        // A client that connects and never sends a request.
        let _idle = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.stop.send(()).unwrap();
        let stopped = tokio::time::timeout(DRAIN_TIMEOUT + Duration::from_secs(5), server.task).await;
        stopped.expect("stops within the drain timeout").unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve(
            addr,
            Arc::new(Metrics::new()),
            watch::channel(true).1,
            std::future::pending(),
        )
        .await
        .expect_err("the address is taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let msg = err.to_string();
        assert!(msg.contains(&addr.to_string()) && !msg.contains('\n'), "{msg}");
    }
}
