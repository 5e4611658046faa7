//! The HTTP endpoints of the controller and of the node agent, on their `--metrics-addr`:
//!
//! | path | answers |
//! |---|---|
//! | `GET /metrics` | the process's [`Exposition`] as OpenMetrics text |
//! | `GET /healthz` | 200 `ok` while the process serves requests (liveness probe) |
//! | `GET /readyz` | 200 `ok` once the process says it is ready, else 503 and a one-line reason (readiness probe) |
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

use crate::runtime::backoff::Backoff;

/// The content type of `/metrics`: OpenMetrics text, what prometheus-client encodes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/metrics` answers.
pub trait Exposition: Send + Sync + 'static {
    /// The metrics as OpenMetrics text.
    fn encode(&self) -> String;
}

/// Readiness, and what `/readyz` says while not ready (one line).
#[derive(Clone)]
pub struct Readiness {
    pub ready: watch::Receiver<bool>,
    pub not_ready: &'static str,
}

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
/// requests in flight finish (up to 5 s). Fails only when it cannot listen on `addr` (the error
/// names it).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    ready: Readiness,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let listener = bind(addr).await?;
    serve_on(listener, metrics, ready, shutdown).await
}

/// [`serve`] on a listener bound beforehand, e.g. to `127.0.0.1:0` to learn the port from
/// `listener.local_addr()` (tests).
pub async fn serve_on(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    ready: Readiness,
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
            let response = respond(req.method(), req.uri().path(), &*metrics, &ready);
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
fn respond(method: &Method, path: &str, metrics: &dyn Exposition, ready: &Readiness) -> Response<Full<Bytes>> {
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
                .insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if *ready.ready.borrow() => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", ready.not_ready),
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts its scrapes.
    #[derive(Default)]
    struct Scrapes(AtomicU64);

    impl Exposition for Scrapes {
        fn encode(&self) -> String {
            let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
            format!("# TYPE scrapes counter\nscrapes_total {n}\n# EOF\n")
        }
    }

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

    async fn start(metrics: Arc<dyn Exposition>) -> Server {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (ready, ready_rx) = watch::channel(false);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let readiness = Readiness {
            ready: ready_rx,
            not_ready: "the watch caches have not synced yet",
        };
        let task = tokio::spawn(serve_on(listener, metrics, readiness, async {
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
        let server = start(Arc::new(Scrapes::default())).await;
        let addr = server.addr;

        assert_eq!(request(addr, "GET", "/healthz").await, (200, "ok\n".into()));
        let (code, body) = request(addr, "GET", "/readyz").await;
        assert_eq!(code, 503);
        assert_eq!(body.lines().count(), 1, "one-line reason: {body:?}");
        assert!(body.contains("not synced"), "{body}");

        server.ready.send(true).unwrap();
        assert_eq!(request(addr, "GET", "/readyz").await, (200, "ok\n".into()));

        let (code, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("scrapes_total 1"), "{body}");
        assert_eq!(
            request(addr, "GET", "/metrics").await.1,
            body.replace("total 1", "total 2")
        );

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
        let server = start(Arc::new(Scrapes::default())).await;
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
            Arc::new(Scrapes::default()),
            Readiness {
                ready: watch::channel(true).1,
                not_ready: "",
            },
            std::future::pending(),
        )
        .await
        .expect_err("the address is taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let msg = err.to_string();
        assert!(msg.contains(&addr.to_string()) && !msg.contains('\n'), "{msg}");
    }
}
