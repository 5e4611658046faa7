//! A cell of the allocation (see `cells`): the families it holds, the GPUs holding their
//! capacity, and its tenants' requests. Its own module because the cells, their placing and
//! their report all read it.

use super::units::{Family, GpuRef};
use crate::policy::TenantProfile;
use std::collections::BTreeSet;

/// The families of one cell and the GPUs holding their capacity.
pub(super) struct Scope {
    pub families: BTreeSet<Family>,
    /// In node, then GPU order (the order every pool walks).
    pub gpus: Vec<GpuRef>,
}

impl Scope {
    /// Whether the cell holds MIG `profile`'s family (found without building the family: a cell
    /// has a few families, and this is asked once per MIG instance).
    pub fn has_mig(&self, profile: &str) -> bool {
        self.families
            .iter()
            .any(|f| matches!(f, Family::Mig(p) if p == profile))
    }
}

/// One cell: its scope, and per tenant with requests in it, the positions of those requests.
pub(super) struct Cell {
    pub scope: Scope,
    pub tenants: Vec<(usize, Vec<usize>)>,
}

impl Cell {
    /// The cell's tenants as the allocator sees them: only their requests in the cell.
    pub fn profiles(&self, tenants: &[TenantProfile]) -> Vec<TenantProfile> {
        self.tenants
            .iter()
            .map(|(t, requests)| TenantProfile {
                requests: requests.iter().map(|&r| tenants[*t].requests[r].clone()).collect(),
                ..tenants[*t].clone()
            })
            .collect()
    }
}
