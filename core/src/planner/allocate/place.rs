//! Placing one cell: how much each tenant gets (the blind pass, [`super::allocator`]), then which
//! units (from what runs now, [`super::sticky`]), kept as it is where placing again from it gives
//! it back ([`super::stable`]); its grants built ([`super::report`]) and its bindings written.

use super::allocator::Allocator;
use super::bound::Bound;
use super::cell_nodes::CellNodes;
use super::report::{Built, Placed};
use super::scope::Scope;
use super::sticky::CellPasses;
use super::units::CellGrants;
use crate::policy::TenantProfile;
use std::collections::BTreeMap;

/// One cell placed with nothing remembered, its bindings written on `nodes`: its grants.
pub(super) fn place_and_write(
    profiles: &[TenantProfile],
    nodes: &mut CellNodes,
    scope: &Scope,
) -> BTreeMap<String, CellGrants> {
    let (grants, bound, _, _) = allocate_cell(profiles, nodes, scope, |placed| {
        placed.grants_with(profiles, nodes, |_, _| None)
    });
    bound.write(nodes, scope, profiles, |_| {});
    grants
}

/// One cell's grants, by tenant name, and its bindings, placed on `nodes` (not written there:
/// [`Bound::write`]), built from the placement kept by `build`. Each pass binds from none of the
/// cell's bindings, so a unit no pass grants is left to nobody.
pub(super) fn allocate_cell(
    tenants: &[TenantProfile],
    nodes: &CellNodes,
    scope: &Scope,
    build: impl FnOnce(Placed) -> Built,
) -> Built {
    if tenants.is_empty() {
        // Capacity nobody asks for (a MIG profile no tenant requests): every pass would only
        // take the units off their holders, as this does.
        return build(Placed::none(Bound::none(nodes, scope)));
    }
    let cell = CellPasses::new(tenants, nodes, scope);
    // How much each tenant gets: blind to what runs now.
    // Its placement stands where nothing runs now; otherwise a pass from what runs now replaces
    // it, and it binds nothing.
    let from_empty = cell.now.holds_nothing();
    let mut blind = Allocator::blind(tenants, nodes, scope, &cell.template, &cell.order, from_empty);
    let amounts = blind.amounts();
    // Which units: from the current bindings. Where nothing runs now (a fleet planned from
    // empty) there is nothing to keep, and the blind pass's placement, on the nodes now, stands
    // for that pass: kept as it is where placing again from it would give it back ([`super::stable`]).
    if from_empty && blind.is_stable(&amounts, &cell.order) {
        let placed = blind.finish();
        return cell.again_in_debug(nodes, &amounts, build(placed));
    }
    // Where nothing runs now, its bindings are what the pass below starts from.
    let blind_bound = blind.bound.take();
    drop(blind);
    let first = if from_empty {
        None
    } else {
        match cell.place_from_now(nodes, &amounts) {
            Some(first) => Some(first),
            None => return build(cell.as_blind(nodes)),
        }
    };
    // Once more from that result, every unit kept: shares over shared GPUs are then split as the
    // next plan would split them (feeding the output back changes nothing). Where that pass
    // would keep every unit of the result ([`super::stable`]: nearly every change), or the result is
    // what runs now and every pool kept first (the same inputs place the same), it would give
    // the result back, so the result is kept.
    let first = match first {
        Some((first, _)) if first.stable => return cell.again_in_debug(nodes, &amounts, build(first)),
        first => first,
    };
    if let Some((first, placings)) = first {
        let placed = first.bound.holders(tenants);
        if placings.is_empty() && placed == cell.now {
            return build(first);
        }
        return match cell.place_again(nodes, &placed, &amounts) {
            Ok(kept) => build(kept),
            // The first placement again (the same inputs place the same).
            Err(_) => build(first),
        };
    }
    // From empty, the blind pass's placement not shown stable: placed again from itself.
    build(cell.again_from_blind(nodes, blind_bound, &amounts))
}
