//! Grants: which tenant gets which MIG instance, whole GPU or GPU share.
//!
//! How much, then which. How much: priority first; within a priority, capacity dedicated to a
//! tenant goes to it, then open capacity is split by weighted fair share, then anything a rule
//! (co-location, topology, policy caps, memory limit) kept from one tenant goes to the others. That
//! pass is blind to what runs now, so amounts never depend on history. Which: [`sticky`] places
//! those same amounts starting from the current bindings, so a tenant keeps the GPUs and instances
//! it holds unless the inputs force a move (docs/design.md#minimal-disruption). Every loop walks capacity
//! in node-name, GPU and placement order, so the result is deterministic.

mod allocator;
mod bound;
mod cell_nodes;
mod cells;
mod exclusive;
mod holders;
mod memo;
mod pools;
mod report;
mod scope;
mod shared;
mod side_by_side;
mod stable;
mod sticky;
mod units;

use super::nodes::NodeDesired;
use crate::policy::TenantProfile;
use allocator::Allocator;
use bound::Bound;
use cell_nodes::CellNodes;
use holders::{Current, Placings};
pub use memo::AllocationMemo;
use pools::Template;
use report::{Built, Placed};
use scope::Scope;
use std::borrow::Cow;
use std::collections::BTreeMap;
use sticky::Amounts;
use units::{CellGrants, PoolKey};
pub use units::{GrantsByTenant, TenantGrants};

/// Grants for every tenant, placed cell by cell ([`cells`]). With a memo, a cell whose inputs
/// are those of the memo's last pass gets its last result back; the result is the same either way.
pub fn allocate(
    tenants: &[TenantProfile],
    nodes: &mut [NodeDesired],
    memo: Option<&mut AllocationMemo>,
) -> GrantsByTenant {
    match memo {
        None => {
            let cells = cells::cells(tenants, nodes);
            // The cores this process may use (its cgroup's CPU quota counts).
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let parts = side_by_side::place_cells(nodes, &cells, threads, |c, nodes| {
                place_and_write(&c.profiles(tenants), nodes, &c.scope)
            })
            .into_iter()
            .map(Cow::Owned)
            .collect();
            report::merge(tenants, &cells, parts)
        }
        Some(memo) => {
            // Every cell's inputs are compared before any cell writes a binding: a MIG GPU can
            // hold instances of two cells.
            let (cells, stale) = memo.cells_and_stale(tenants, nodes);
            let mut recomputed: Vec<u32> = Vec::new();
            for (cell, stale) in cells.iter().zip(&stale) {
                if *stale {
                    let profiles = cell.profiles(tenants);
                    let mut view = CellNodes::all(nodes);
                    let mut last = memo.last_of(cell);
                    let (grants, bound, positions, handed_back) =
                        allocate_cell(&profiles, &view, &cell.scope, |placed| {
                            placed.grants_with(&profiles, &view, |t, p| {
                                memo.earlier_grants(last.as_mut(), &profiles[t], p)
                            })
                        });
                    // A node the cell binds as the last pass did keeps its GPU list, and the
                    // steps after take it back as they would had the cell not been placed.
                    bound.write(&mut view, &cell.scope, &profiles, |n| {
                        view_recomputed(&mut recomputed, n)
                    });
                    drop(view);
                    for &n in &recomputed {
                        nodes[n as usize].recomputed = true;
                    }
                    recomputed.clear();
                    memo.remember(cell, profiles, nodes, bound, (grants, positions, handed_back), last);
                } else {
                    memo.recall(cell, nodes);
                }
            }
            memo.keep_only(&cells);
            memo.placed = stale.iter().filter(|s| **s).count();
            memo.reused = cells.len() - memo.placed;
            let grants = memo.merge(tenants, &cells, &stale);
            memo.keep_cells(cells);
            grants
        }
    }
}

/// One cell placed with nothing remembered, its bindings written on `nodes`: its grants.
fn place_and_write(profiles: &[TenantProfile], nodes: &mut CellNodes, scope: &Scope) -> BTreeMap<String, CellGrants> {
    let (grants, bound, _, _) = allocate_cell(profiles, nodes, scope, |placed| {
        placed.grants_with(profiles, nodes, |_, _| None)
    });
    bound.write(nodes, scope, profiles, |_| {});
    grants
}

/// Notes node `n` as written on (once, though several of its GPUs are).
fn view_recomputed(recomputed: &mut Vec<u32>, n: u32) {
    if recomputed.last() != Some(&n) {
        recomputed.push(n);
    }
}

/// One cell's grants, by tenant name, and its bindings, placed on `nodes` (not written there:
/// [`Bound::write`]), built from the placement kept by `build`. Each pass binds from none of the
/// cell's bindings, so a unit no pass grants is left to nobody.
fn allocate_cell(
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
    let mut order: Vec<usize> = (0..tenants.len()).collect();
    order.sort_by(|&x, &y| {
        tenants[y]
            .priority
            .cmp(&tenants[x].priority)
            .then(tenants[x].name.cmp(&tenants[y].name))
    });
    let cell = CellPasses {
        tenants,
        scope,
        now: Current::from_inventory(nodes, scope),
        template: Template::of(nodes, scope),
        order,
    };
    // How much each tenant gets: blind to what runs now.
    // Its placement stands where nothing runs now; otherwise a pass from what runs now replaces
    // it, and it binds nothing.
    let from_empty = cell.now.holds_nothing();
    let mut blind = blind_pass(tenants, nodes, scope, &cell.template, &cell.order, from_empty);
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
    let placed = match &blind_bound {
        Some(bound) => bound.holders(tenants),
        None => Current::of(Vec::new()),
    };
    match cell.place_again(nodes, &placed, &amounts) {
        Ok(kept) => build(kept),
        Err(_) => match cell.place_from_now(nodes, &amounts) {
            Some((kept, _)) => build(kept),
            None => build(cell.as_blind(nodes)),
        },
    }
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

impl CellPasses<'_> {
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
        blind_pass(self.tenants, nodes, self.scope, &self.template, &self.order, true).finish()
    }
}

/// The pass that decides how much each tenant gets, blind to what runs now; `binds`: whether its
/// grants are bound.
fn blind_pass<'n, 'v, 'a>(
    tenants: &'n [TenantProfile],
    nodes: &'n CellNodes<'v, 'a>,
    scope: &'n Scope,
    template: &Template,
    order: &[usize],
    binds: bool,
) -> Allocator<'n, 'v, 'a> {
    let mut blind = Allocator::new(tenants, nodes, scope, template, None, binds);
    for level in order.chunk_by(|&x, &y| tenants[x].priority == tenants[y].priority) {
        blind.serve_level(level);
    }
    blind
}
