//! What the controller and the node agent both need and neither owns: the API client and the
//! process's shutdown signal ([`client`]), and the retry backoff of failed passes ([`backoff`]).

pub mod backoff;
pub mod client;
