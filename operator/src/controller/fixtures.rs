//! A Kubernetes client whose API server is the test: every request the code under test makes
//! arrives at an [`ApiServer`], which checks it (method, path and query, content type, body) in
//! order and answers it, as kube-rs/controller-rs's `ApiServerVerifier` does. A request the test
//! did not expect fails it; so does one it expected and that never came.

use hyper::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One request as the code under test sent it, waiting for its answer.
pub struct Sent {
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    pub content_type: Option<String>,
    /// The body as JSON (`null` when empty).
    pub body: Value,
    answer: oneshot::Sender<Response<Body>>,
}

impl Sent {
    /// `METHOD /path?query`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.uri)
    }

    /// Answers with `status` and `body`.
    pub fn answer(self, status: u16, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("JSON")))
            .expect("a response");
        let _ = self.answer.send(response);
    }

    /// Answers as the API server does to a write that succeeded: with the object (the body
    /// sent when it is a whole one, else an object of that name).
    pub fn ok(self) {
        let object = if self.body.get("kind").is_some() {
            self.body.clone()
        } else {
            let name = self
                .uri
                .split('?')
                .next()
                .unwrap_or_default()
                .rsplit('/')
                .next()
                .unwrap_or_default();
            json!({"metadata": {"name": name}})
        };
        self.answer(200, &object);
    }

    /// Answers with a Status of `code` and `reason`, as the API server refuses.
    pub fn refuse(self, code: u16, reason: &str) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("refused by the test: {reason}"), "reason": reason, "code": code});
        self.answer(code, &status);
    }
}

/// The test's side: the requests in the order they were sent.
pub struct ApiServer {
    requests: mpsc::UnboundedReceiver<Sent>,
}

/// A client whose requests go to the returned [`ApiServer`].
pub fn mock_client() -> (Client, ApiServer) {
    let (tx, requests) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |req: Request<Body>| {
        let tx = tx.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await?;
            let (answer, answered) = oneshot::channel();
            let sent = Sent {
                method: parts.method.to_string(),
                uri: parts.uri.path_and_query().map(ToString::to_string).unwrap_or_default(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                answer,
            };
            tx.send(sent).map_err(|_| "the test's API server is gone")?;
            Ok::<_, BoxError>(answered.await.map_err(|_| "the test did not answer")?)
        }
    });
    (Client::new(service, "default"), ApiServer { requests })
}

impl ApiServer {
    /// The next request; fails the test if none comes within five seconds.
    pub async fn next(&mut self) -> Sent {
        tokio::time::timeout(std::time::Duration::from_secs(5), self.requests.recv())
            .await
            .expect("a request within 5 s")
            .expect("the client is alive")
    }

    /// The next request, checked to be `line` (`METHOD /path?query`).
    pub async fn expect(&mut self, line: &str) -> Sent {
        let sent = self.next().await;
        assert_eq!(sent.line(), line, "body: {}", sent.body);
        sent
    }

    /// No further request comes (within 200 ms of the last).
    pub async fn no_more(&mut self) {
        let more = tokio::time::timeout(std::time::Duration::from_millis(200), self.requests.recv()).await;
        if let Ok(Some(sent)) = more {
            panic!("an unexpected request: {} {}", sent.line(), sent.body);
        }
    }
}
