//! The few calls `report` makes to Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`),
//! over plain HTTP with hyper, and the parsing of their JSON answers.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long one query may take before the report gives up on it.
const QUERY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a query gave no answer. Each names the server and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error(
        "--prometheus {0:?} is not an http:// URL (e.g. http://prometheus.monitoring:9090); for an https endpoint, port-forward it or put a plain-HTTP proxy in front"
    )]
    Url(String),
    #[error("cannot reach Prometheus at {url}: {message}; check --prometheus and that it answers /api/v1/query")]
    Unreachable { url: String, message: String },
    #[error("Prometheus at {url} did not answer {query:?} within {QUERY_TIMEOUT:?}")]
    Timeout { url: String, query: String },
    #[error("Prometheus at {url} refused {query:?}: {message}")]
    Refused {
        url: String,
        query: String,
        message: String,
    },
}

/// An instant sample: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A range series: its labels and (unix seconds, value) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// A Prometheus server.
pub struct Prometheus {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<ResultItem>,
}

#[derive(Deserialize)]
struct ResultItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

/// Prometheus writes values as strings (`"1.5"`, `"NaN"`, `"+Inf"`).
fn number(s: &str) -> f64 {
    s.parse().unwrap_or(f64::NAN)
}

impl Prometheus {
    /// `url`: Prometheus' base URL, e.g. `http://localhost:9090` (a path prefix is kept).
    pub fn new(url: &str) -> Result<Prometheus, PromError> {
        let base = url.trim_end_matches('/').to_string();
        let ok = base.strip_prefix("http://").is_some_and(|rest| !rest.is_empty()) && base.parse::<Uri>().is_ok();
        if !ok {
            return Err(PromError::Url(url.into()));
        }
        Ok(Prometheus {
            base,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    async fn call(&self, path: &str, form: &[(&str, String)], query: &str) -> Result<Data, PromError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
            .finish();
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.base))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| PromError::Url(format!("{}: {e}", self.base)))?;
        let unreachable = |message: String| PromError::Unreachable {
            url: self.base.clone(),
            message,
        };
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, PromError>((status, bytes))
        };
        let (status, bytes) =
            tokio::time::timeout(QUERY_TIMEOUT, exchange)
                .await
                .map_err(|_| PromError::Timeout {
                    url: self.base.clone(),
                    query: query.into(),
                })??;
        let refused = |message: String| PromError::Refused {
            url: self.base.clone(),
            query: query.into(),
            message,
        };
        let answer: Answer = serde_json::from_slice(&bytes).map_err(|e| {
            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            refused(format!("HTTP {status}, not Prometheus' JSON ({e}): {head}"))
        })?;
        match (answer.status.as_str(), answer.data) {
            ("success", Some(d)) => Ok(d),
            _ => Err(refused(answer.error.unwrap_or_else(|| format!("HTTP {status}")))),
        }
    }

    /// An instant query at `time` (unix seconds; now when `None`).
    pub async fn query(&self, expr: &str, time: Option<f64>) -> Result<Vec<Sample>, PromError> {
        let mut form = vec![("query", expr.to_string())];
        if let Some(t) = time {
            form.push(("time", format!("{t:.3}")));
        }
        let d = self.call("/api/v1/query", &form, expr).await?;
        if d.result_type != "vector" {
            return Err(PromError::Refused {
                url: self.base.clone(),
                query: expr.into(),
                message: format!("answered a {}, not an instant vector", d.result_type),
            });
        }
        Ok(d.result
            .into_iter()
            .filter_map(|r| {
                Some(Sample {
                    labels: r.metric,
                    value: number(&r.value?.1),
                })
            })
            .collect())
    }

    /// A range query from `start` to `end` (unix seconds) every `step` seconds.
    pub async fn query_range(&self, expr: &str, start: f64, end: f64, step: f64) -> Result<Vec<Series>, PromError> {
        let form = [
            ("query", expr.to_string()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", format!("{step:.3}")),
        ];
        let d = self.call("/api/v1/query_range", &form, expr).await?;
        Ok(d.result
            .into_iter()
            .map(|r| Series {
                labels: r.metric,
                points: r.values.into_iter().map(|(t, v)| (t, number(&v))).collect(),
            })
            .collect())
    }

    /// The server's time now (unix seconds), so a report's window is the server's, whatever
    /// this machine's clock says.
    pub async fn now(&self) -> Result<f64, PromError> {
        let expr = "vector(time())";
        self.query(expr, None)
            .await?
            .first()
            .map(|s| s.value)
            .ok_or_else(|| PromError::Refused {
                url: self.base.clone(),
                query: expr.into(),
                message: "no time in the answer".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_are_taken() {
        assert!(Prometheus::new("http://localhost:9090/").is_ok());
        assert!(Prometheus::new("http://prom.monitoring/prometheus").is_ok());
        for bad in ["https://prom:9090", "localhost:9090", "http://", "ftp://x"] {
            let e = Prometheus::new(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.to_string().contains("--prometheus"), "{e}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_an_error_naming_it() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = Prometheus::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = p.query("up", None).await.unwrap_err();
        assert!(matches!(e, PromError::Unreachable { .. }), "{e}");
        assert!(e.to_string().contains(&port.to_string()), "{e}");
    }
}
