//! `gpu-tenancy controller`: keeps the cluster equal to the desired state.
//!
//! The shape of linkerd's policy-controller: watches feed in-memory stores ([`stores`]); after a
//! burst of changes settles (debounce), one pass computes the whole fleet's desired state with the
//! same pure function `gpu-tenancy plan` prints ([`crate::desired::desired`]), diffs it against the
//! stores ([`diff`]) and one writer makes only the writes that change something ([`writer`]).
//! Only the leader writes; followers keep their stores warm to take over at once. Nothing requeues
//! on a timer: a pass runs when something changed, or after a failed pass, with backoff. Which
//! kinds are watched and written, and in which order, is one table ([`kinds`]).

pub mod diff;
mod evict;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod kinds;
pub mod leader;
pub mod metrics;
mod pass;
mod run;
pub mod stores;
pub mod thread_time;
pub mod writer;

pub use pass::{Controller, PassMemo, PassReport, desired_of, desired_with_memo, node_inventories, now_seconds};
pub use run::{LeaderOptions, Options, run};

/// The default of the controller's `--metrics-addr` (metrics and probes, [`crate::runtime::http`]).
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:8080";
