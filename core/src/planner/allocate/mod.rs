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
mod merge;
mod place;
mod pools;
mod report;
mod scope;
mod shared;
mod side_by_side;
mod spread;
mod stable;
mod sticky;
mod template;
mod units;

use super::nodes::NodeDesired;
use crate::policy::TenantProfile;
use cell_nodes::CellNodes;
pub use memo::AllocationMemo;
use place::{allocate_cell, place_and_write, view_recomputed};
use std::borrow::Cow;
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
            merge::merge(tenants, &cells, parts)
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
