//! What the controller and the node agent both need and neither owns: the API client, the
//! parameters of every server-side apply and the process's shutdown signal ([`client`]), the
//! retry backoff of failed passes ([`backoff`]), whether a live object already holds what would
//! be written ([`object`]), and the metrics and health endpoints ([`http`]).

pub mod backoff;
pub mod client;
pub mod http;
pub mod object;
