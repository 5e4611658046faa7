//! The last stage: each tenant's grants merged from those of its cells, one allocation entry and
//! at most one shortfall per request.

use super::scope::Cell;
use super::units::{CellGrants, GrantsByTenant, TenantGrants};
use crate::api::AllocationSummary;
use crate::policy::TenantProfile;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A request's summary, and why it fell short if it did.
type RequestOutcome = (AllocationSummary, Option<String>);

/// One tenant's grants from its cells' (`parts`, one per cell of `cells`, by tenant name): grants
/// sorted by node, GPU and placement, one allocation entry and at most one shortfall per request,
/// in request order. `of_tenant` are its cells (index in `cells`) with its requests in each.
pub(super) fn merge_tenant(
    tenant: &TenantProfile,
    of_tenant: &[(usize, &[usize])],
    parts: &mut [Cow<'_, BTreeMap<String, CellGrants>>],
) -> TenantGrants {
    let mut per_request: Vec<Option<RequestOutcome>> = vec![None; tenant.requests.len()];
    let mut grants = Vec::new();
    let mut memory_mib = 0;
    for &(c, requests) in of_tenant {
        let taken = match &mut parts[c] {
            Cow::Owned(p) => p.remove(&tenant.name),
            Cow::Borrowed(p) => p.get(&tenant.name).cloned(),
        };
        let Some(g) = taken else { continue };
        let mut shortfalls = g.shortfalls.into_iter();
        for (&r, summary) in requests.iter().zip(g.allocation) {
            let short = (summary.granted < summary.requested)
                .then(|| shortfalls.next())
                .flatten();
            per_request[r] = Some((summary, short));
        }
        // A tenant in one cell (nearly every tenant) keeps that cell's list as it is.
        if grants.is_empty() {
            grants = g.grants;
        } else {
            grants.extend(g.grants);
        }
        memory_mib += g.memory_mib;
    }
    grants.sort_by(|a, b| (&a.node, a.gpu, &a.placement).cmp(&(&b.node, b.gpu, &b.placement)));
    let mut all = TenantGrants {
        grants: grants.into(),
        memory_mib,
        ..TenantGrants::default()
    };
    for (summary, short) in per_request.into_iter().flatten() {
        all.allocation.push(summary);
        all.shortfalls.extend(short);
    }
    all
}

/// Per tenant, its cells (index in `cells`) with its requests in each, in cell order.
pub(super) fn cells_of_tenants<'c>(tenants: &[TenantProfile], cells: &'c [Cell]) -> Vec<Vec<(usize, &'c [usize])>> {
    let mut out: Vec<Vec<(usize, &[usize])>> = vec![Vec::new(); tenants.len()];
    for (c, cell) in cells.iter().enumerate() {
        for (t, requests) in &cell.tenants {
            out[*t].push((c, requests.as_slice()));
        }
    }
    out
}

/// Every tenant's grants from its cells' ([`merge_tenant`]).
pub(super) fn merge(
    tenants: &[TenantProfile],
    cells: &[Cell],
    mut parts: Vec<Cow<'_, BTreeMap<String, CellGrants>>>,
) -> GrantsByTenant {
    let of_tenants = cells_of_tenants(tenants, cells);
    tenants
        .iter()
        .zip(&of_tenants)
        .map(|(t, of)| (t.name.clone(), Arc::new(merge_tenant(t, of, &mut parts))))
        .collect()
}
