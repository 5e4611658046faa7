//! Placing one cell: how much each tenant gets (the blind pass, [`super::allocator`]), then which
//! units (from what runs now, [`super::sticky`]), kept as it is where placing again from it gives
//! it back ([`super::stable`]); its grants built ([`super::report`]) and its bindings written.

use super::allocator::Allocator;
use super::bound::Bound;
use super::cell_nodes::CellNodes;
use super::holders::{Current, Placings};
use super::report::{Built, Placed};
use super::scope::Scope;
use super::sticky::{self, Amounts};
use super::template::Template;
use super::units::{CellGrants, PoolKey};
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

/// Notes node `n` as written on (once, though several of its GPUs are).
pub(super) fn view_recomputed(recomputed: &mut Vec<u32>, n: u32) {
    if recomputed.last() != Some(&n) {
        recomputed.push(n);
    }
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
    // for that pass: kept as it is where placing again from it would give it back ([`stable`]).
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
    // would keep every unit of the result ([`stable`]: nearly every change), or the result is
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

/// What every placing pass of one cell starts from.
struct CellPasses<'c> {
    tenants: &'c [TenantProfile],
    scope: &'c Scope,
    /// Who holds each unit now.
    now: Current<'c>,
    template: Template,
    /// Tenants by priority, then name.
    order: Vec<usize>,
}

impl<'c> CellPasses<'c> {
    /// The passes of the cell of `scope` over `nodes`, its `tenants` served by priority, then name.
    fn new(tenants: &'c [TenantProfile], nodes: &'c CellNodes, scope: &'c Scope) -> Self {
        let mut order: Vec<usize> = (0..tenants.len()).collect();
        order.sort_by(|&x, &y| {
            tenants[y]
                .priority
                .cmp(&tenants[x].priority)
                .then(tenants[x].name.cmp(&tenants[y].name))
        });
        CellPasses {
            tenants,
            scope,
            now: Current::from_inventory(nodes, scope),
            template: Template::of(nodes, scope),
            order,
        }
    }
}

impl CellPasses<'_> {
    /// Where nothing runs now and the blind pass's placement (its bindings, `blind_bound`) is not
    /// shown stable: placed again from itself; failing that, from what runs now; failing that, as
    /// the blind pass placed it.
    fn again_from_blind(&self, nodes: &CellNodes, blind_bound: Option<Bound>, amounts: &Amounts) -> Placed {
        let placed = match &blind_bound {
            Some(bound) => bound.holders(self.tenants),
            None => Current::of(Vec::new()),
        };
        match self.place_again(nodes, &placed, amounts) {
            Ok(kept) => kept,
            Err(_) => match self.place_from_now(nodes, amounts) {
                Some((kept, _)) => kept,
                None => self.as_blind(nodes),
            },
        }
    }

    /// Places `amounts` from the current bindings. A pool where the units kept leave no room for
    /// some amount (shared GPUs: co-location splits them by tier) is placed again with less
    /// stickiness: kept level by level, then as the blind pass placed it. `None`: only the blind
    /// pass's placement gives the amounts (memory limits tie pools together).
    fn place_from_now(&self, nodes: &CellNodes, amounts: &Amounts) -> Option<(Placed, Placings)> {
        let mut placings = Placings::new();
        loop {
            let at = sticky::place(
                self.tenants,
                nodes,
                self.scope,
                &self.template,
                &self.now,
                &placings,
                amounts,
                &self.order,
            );
            match at {
                Ok(placed) => return Some((placed, placings)),
                Err(failed) => {
                    for key in failed {
                        let p = placings.entry(key).or_default();
                        *p = p.less_sticky()?;
                    }
                }
            }
        }
    }

    /// Places `amounts` again from `placed`, a placement just made, every unit kept: the pass
    /// that makes a result the one the next plan would make.
    fn place_again(&self, nodes: &CellNodes, placed: &Current, amounts: &Amounts) -> Result<Placed, Vec<PoolKey>> {
        sticky::place(
            self.tenants,
            nodes,
            self.scope,
            &self.template,
            placed,
            &Placings::new(),
            amounts,
            &self.order,
        )
    }

    /// `built` from a placement that placing again from itself gives back ([`stable`]). Debug
    /// builds (every test) place again all the same, and compare: the grants built, or handed
    /// back from an earlier pass, with those of the placement again, built anew.
    fn again_in_debug(&self, nodes: &CellNodes, amounts: &Amounts, built: Built) -> Built {
        if cfg!(debug_assertions) {
            let (grants, bound, _, _) = &built;
            let placed = bound.holders(self.tenants);
            let again = self
                .place_again(nodes, &placed, amounts)
                .expect("a stable placement places again");
            let (again_grants, again_bound) = again.grants(self.tenants, nodes);
            assert!(
                again_bound.holders(self.tenants) == placed,
                "a placement found stable moved when placed again"
            );
            assert_eq!(&again_grants, grants, "a stable placement's grants changed");
        }
        built
    }

    /// The blind pass's placement, where no placing from current bindings gives its amounts.
    fn as_blind(&self, nodes: &CellNodes) -> Placed {
        Allocator::blind(self.tenants, nodes, self.scope, &self.template, &self.order, true).finish()
    }
}
