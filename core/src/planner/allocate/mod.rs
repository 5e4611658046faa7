//! Grants: which tenant gets which MIG instance, whole GPU or GPU share.
//!
//! How much, then which. How much: priority first; within a priority, capacity dedicated to a
//! tenant goes to it, then open capacity is split by weighted fair share, then anything a rule
//! (co-location, topology, policy caps, memory limit) kept from one tenant goes to the others. That
//! pass is blind to what runs now, so amounts never depend on history. Which: [`sticky`] places
//! those same amounts starting from the current bindings, so a tenant keeps the GPUs and instances
//! it holds unless the inputs force a move (docs/design.md#minimal-disruption). Every loop walks capacity
//! in node-name, GPU and placement order, so the result is deterministic.
//!
//! A pass in stages: the tenants' requests and the fleet's GPUs split into independent cells
//! ([`cells`]; with a memo, read against the last pass's first, [`memo`]); each cell placed
//! ([`place`]: the blind pass, [`allocator`], then [`sticky`], [`stable`], [`report`]), side by
//! side or, with a memo, only where its inputs changed; each tenant's grants merged from its
//! cells' ([`merge`]).

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
pub use memo::AllocationMemo;
use place::place_and_write;
use std::borrow::Cow;
pub use units::{GrantsByTenant, TenantGrants};

/// Grants for every tenant, placed cell by cell ([`cells`]). With a memo, a cell whose inputs
/// are those of the memo's last pass gets its last result back; the result is the same either way.
pub fn allocate(
    tenants: &[TenantProfile],
    nodes: &mut [NodeDesired],
    memo: Option<&mut AllocationMemo>,
) -> GrantsByTenant {
    let Some(memo) = memo else {
        let cells = cells::cells(tenants, nodes);
        // The cores this process may use (its cgroup's CPU quota counts).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let parts = side_by_side::place_cells(nodes, &cells, threads, |c, nodes| {
            place_and_write(&c.profiles(tenants), nodes, &c.scope)
        });
        return merge::merge(tenants, &cells, parts.into_iter().map(Cow::Owned).collect());
    };
    memo.allocate(tenants, nodes)
}
