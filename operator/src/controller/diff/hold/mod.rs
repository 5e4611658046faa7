//! Bookkeeping that waits while nodes join: a quota that only widens and a tenant status that
//! says nothing new to admission or in its conditions are held back from a pass that gives some
//! node its first GPU spec, when the controller wrote the same object less than [`HOLD_AT_MOST`]
//! before. They go out with the first pass in which no node joins, or once that time has passed
//! since the object's last write, whichever comes first.
//!
//! Why: while a fleet joins, every pass grows the tenants' grants, and each pass wrote every
//! tenant's quota and status again, each apply also costing the quota controller's status update.
//! The API server is what bounds that phase (docs/decisions/hold-bookkeeping-while-nodes-join.md). A change to a tenant or a plan gives no node its first spec, so its bookkeeping goes
//! with it.
//!
//! Fail closed: a quota held is narrower than the grant it follows (pods beyond it are refused
//! until it widens). A quota that narrows, gains or loses a key or changes its labels, a new one,
//! and a tenant status whose `admission` (what the tenants' admission policies read), observed
//! generation or any condition's status or reason differ from the live one go out at once. So does
//! every object's first write since the controller started.

use super::write::{Kind, Write};
use crate::api::{GpuTenant, GpuTenantStatus};
use crate::controller::stores::Snapshot;
use crate::desired::Desired;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long after an object's last write a widening of it may wait for the nodes.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(30);

/// A bookkeeping object: its kind, namespace and name.
type Key = (Kind, Option<String>, String);

/// When this controller last wrote each bookkeeping object, for [`HOLD_AT_MOST`].
#[derive(Debug, Default)]
pub struct Recent {
    written: HashMap<Key, Instant>,
}

/// What a pass held back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Writes held back.
    pub writes: usize,
    /// When the first of them must go even if nodes still join: the controller
    /// plans again by then.
    pub until: Option<Instant>,
}

/// The bookkeeping object `w` writes, if it writes one that may be held.
fn key_of(w: &Write) -> Option<Key> {
    match w {
        Write::Apply {
            kind: Kind::ResourceQuota,
            namespace,
            name,
            ..
        } => Some((Kind::ResourceQuota, namespace.clone(), name.clone())),
        Write::Status {
            kind: Kind::GpuTenant,
            name,
            ..
        } => Some((Kind::GpuTenant, None, name.clone())),
        _ => None,
    }
}

impl Recent {
    /// Takes out of `writes` (a pass in which some node joins) the bookkeeping that may wait (see
    /// the module), and records the bookkeeping writes that remain as made at `now`.
    pub(super) fn hold(&mut self, writes: &mut Vec<Write>, d: &Desired, live: &Snapshot, now: Instant) -> Held {
        self.forget_before(now);
        let mut held = Held::default();
        if !self.written.is_empty() {
            let mut may_wait = MayWait::new(d, live);
            writes.retain(|w| {
                let Some(at) = key_of(w).and_then(|k| self.written.get(&k).copied()) else {
                    return true;
                };
                if !may_wait.check(w) {
                    return true;
                }
                held.writes += 1;
                let until = at + HOLD_AT_MOST;
                held.until = Some(held.until.map_or(until, |u| u.min(until)));
                false
            });
        }
        self.wrote(writes, now);
        held
    }

    /// Records the bookkeeping writes of a pass that holds nothing back, as made at `now`.
    pub(super) fn wrote(&mut self, writes: &[Write], now: Instant) -> Held {
        self.forget_before(now);
        for key in writes.iter().filter_map(key_of) {
            self.written.insert(key, now);
        }
        Held::default()
    }

    fn forget_before(&mut self, now: Instant) {
        self.written
            .retain(|_, at| now.saturating_duration_since(*at) < HOLD_AT_MOST);
    }
}

/// The desired and live quotas and tenants, indexed on first use.
struct MayWait<'a> {
    d: &'a Desired,
    live: &'a Snapshot,
    quotas: Option<(QuotaIndex<'a>, QuotaIndex<'a>)>,
    tenants: Option<(TenantIndex<'a>, TenantIndex<'a>)>,
}

type QuotaIndex<'a> = BTreeMap<(Option<&'a str>, &'a str), &'a ResourceQuota>;
type TenantIndex<'a> = BTreeMap<&'a str, &'a GpuTenant>;

fn quota_index<'a>(qs: &'a [std::sync::Arc<ResourceQuota>]) -> QuotaIndex<'a> {
    qs.iter()
        .map(|q| {
            let m = &q.metadata;
            ((m.namespace.as_deref(), m.name.as_deref().unwrap_or_default()), &**q)
        })
        .collect()
}

fn tenant_index<'a>(ts: &'a [std::sync::Arc<GpuTenant>]) -> TenantIndex<'a> {
    ts.iter()
        .map(|t| (t.metadata.name.as_deref().unwrap_or_default(), &**t))
        .collect()
}

impl<'a> MayWait<'a> {
    fn new(d: &'a Desired, live: &'a Snapshot) -> Self {
        MayWait {
            d,
            live,
            quotas: None,
            tenants: None,
        }
    }

    fn check(&mut self, w: &Write) -> bool {
        match w {
            Write::Apply {
                kind: Kind::ResourceQuota,
                namespace,
                name,
                ..
            } => {
                let (d, live) = (self.d, self.live);
                let (want, have) = self
                    .quotas
                    .get_or_insert_with(|| (quota_index(&d.resource_quotas), quota_index(&live.quotas)));
                let key = (namespace.as_deref(), name.as_str());
                matches!((want.get(&key), have.get(&key)), (Some(w), Some(h)) if quota_only_widens(w, h))
            }
            Write::Status {
                kind: Kind::GpuTenant,
                name,
                ..
            } => {
                let (d, live) = (self.d, self.live);
                let (want, have) = self
                    .tenants
                    .get_or_insert_with(|| (tenant_index(&d.tenants), tenant_index(&live.tenants)));
                let status = |i: &TenantIndex<'a>| i.get(name.as_str()).and_then(|t| t.status.as_ref());
                matches!((status(want), status(have)), (Some(w), Some(h)) if status_says_nothing_new(w, h))
            }
            _ => false,
        }
    }
}

/// `want` allows at least what `have` allows, and differs from it in nothing else the quota
/// enforces: the same labels (the tenant it belongs to), scopes and keys, and under every key a
/// whole number at least as large. Anything it cannot read as such is not a widening.
pub(super) fn quota_only_widens(want: &ResourceQuota, have: &ResourceQuota) -> bool {
    if want.labels().iter().any(|(k, v)| have.labels().get(k) != Some(v)) {
        return false;
    }
    let (Some(w), Some(h)) = (want.spec.as_ref(), have.spec.as_ref()) else {
        return false;
    };
    if w.scopes != h.scopes || w.scope_selector != h.scope_selector {
        return false;
    }
    let (Some(wh), Some(hh)) = (w.hard.as_ref(), h.hard.as_ref()) else {
        return false;
    };
    wh.len() == hh.len()
        && wh.iter().all(|(k, want)| {
            let have = hh.get(k).and_then(|q| q.0.parse::<u64>().ok());
            matches!((want.0.parse::<u64>().ok(), have), (Some(want), Some(have)) if want >= have)
        })
}

/// A tenant's status that admission reads the same from, for the same generation, with every
/// condition's status and reason as they are: what changes is counts, grants and messages.
pub(super) fn status_says_nothing_new(want: &GpuTenantStatus, have: &GpuTenantStatus) -> bool {
    let verdicts = |s: &GpuTenantStatus| -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    want.admission == have.admission
        && want.observed_generation == have.observed_generation
        && verdicts(want) == verdicts(have)
}

#[cfg(test)]
mod tests;
