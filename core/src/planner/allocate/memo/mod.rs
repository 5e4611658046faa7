//! The memo that lets a pass re-plan only the cells its change can affect.
//!
//! [`AllocationMemo`] keeps each cell's inputs and result from the last pass. A cell whose inputs
//! are equal (the requests of its tenants with everything their policies say, and every GPU of
//! its families: layout, dedication, what it is and what runs on it now) gets its last result
//! back without being placed again: the allocation is a pure function of those inputs. So does a
//! cell whose GPUs changed only in what runs on them, to what its last result bound there, when
//! every GPU of it runs that result (`CellResults::stale`).
//!
//! A pass reads its inputs against the last pass's ([`inputs`]), then places the cells whose
//! inputs changed, takes the others' last results back, and merges each tenant's grants from
//! its cells' ([`results`]).

mod inputs;
mod results;

use super::units::GrantsByTenant;
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;
use inputs::LastInputs;
use results::CellResults;

/// The fleet's GPUs as the last pass read them, and each cell's tenants and result, by the cell's
/// families. Kept by the controller between passes; a planner run without one places every cell.
#[derive(Default)]
pub struct AllocationMemo {
    inputs: LastInputs,
    results: CellResults,
    /// Cells placed, and cells taken from the memo, in the last pass.
    pub placed: usize,
    pub reused: usize,
}

impl AllocationMemo {
    /// Grants for every tenant, as [`super::allocate`] gives them, each cell whose inputs are
    /// those of the last pass given its last result back.
    pub(super) fn allocate(&mut self, tenants: &[TenantProfile], nodes: &mut [NodeDesired]) -> GrantsByTenant {
        // Every cell's inputs are compared before any cell writes a binding: a MIG GPU can hold
        // instances of two cells.
        self.inputs.read(tenants, nodes);
        let cells = self.inputs.cells();
        let stale = self.results.stale(cells, tenants, self.inputs.changed(), nodes);
        let mut recomputed: Vec<u32> = Vec::new();
        for (cell, stale) in cells.iter().zip(&stale) {
            if *stale {
                self.results
                    .place_again(cell, tenants, nodes, self.inputs.changed(), &mut recomputed);
            } else {
                self.results.recall(cell, nodes);
            }
        }
        self.results.keep_only(cells);
        self.placed = stale.iter().filter(|s| **s).count();
        self.reused = cells.len() - self.placed;
        self.results.merge(tenants, cells, &stale)
    }
}
