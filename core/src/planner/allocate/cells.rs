//! Independent parts of the allocation: which families of capacity a memory-limited tenant ties
//! together.
//!
//! Every grant comes from a pool of one family of capacity (a MIG profile, exclusive GPUs, MPS or
//! time-slicing shares), and a request draws from its own family only. Families meet only in a
//! tenant's memory limit, which counts memory across all of its requests. So the families fall
//! into cells (families joined by some memory-limited tenant asking for both), and each cell is
//! placed on its own: the tenants' requests in it, over the GPUs and MIG instances of its families,
//! in the same priority, fair-share and node order as the whole fleet would be. The result of the
//! fleet is the union of the cells'. [`super::memo`] keeps each cell's inputs and result.

use super::scope::{Cell, Scope};
use super::units::{Family, GpuRef};
use crate::api::Mode;
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;
use std::collections::{BTreeMap, BTreeSet};

/// Families by number, in the order first seen (names are looked up, not cloned: a fleet has a
/// few families and hundreds of thousands of MIG instances, so a short list scanned beats a hash).
#[derive(Default)]
struct Families<'a> {
    list: Vec<Family>,
    mig: Vec<(&'a str, usize)>,
    other: Vec<(Mode, usize)>,
}

impl<'a> Families<'a> {
    fn of(&mut self, mode: Mode, profile: Option<&'a str>) -> usize {
        let n = self.list.len();
        let i = match mode {
            Mode::Mig => {
                let name = profile.unwrap_or_default();
                match self.mig.iter().find(|(p, _)| *p == name) {
                    Some(&(_, i)) => i,
                    None => {
                        self.mig.push((name, n));
                        n
                    }
                }
            }
            m => match self.other.iter().find(|(o, _)| *o == m) {
                Some(&(_, i)) => i,
                None => {
                    self.other.push((m, n));
                    n
                }
            },
        };
        if i == n {
            self.list.push(Family::of(mode, profile));
        }
        i
    }
}

pub(super) fn root(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// Splits the allocation into its independent cells, in the order of their first family.
pub(super) fn cells(tenants: &[TenantProfile], nodes: &[NodeDesired]) -> Vec<Cell> {
    let mut families = Families::default();
    let requests: Vec<Vec<usize>> = tenants
        .iter()
        .map(|t| {
            t.requests
                .iter()
                .map(|r| families.of(r.mode, r.profile.as_deref()))
                .collect()
        })
        .collect();
    let gpus = gpu_families(nodes, &mut families);
    let families = families.list;
    let mut parent: Vec<usize> = (0..families.len()).collect();
    // A memory limit counts across all of a tenant's requests: their families are placed together.
    for (t, fams) in tenants.iter().zip(&requests) {
        if t.memory_limit_mib.is_some() {
            for w in fams.windows(2) {
                let (a, b) = (root(&mut parent, w[0]), root(&mut parent, w[1]));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    // Cells by their root family.
    let mut out: Vec<Option<Cell>> = (0..families.len()).map(|_| None).collect();
    for (f, family) in families.iter().enumerate() {
        let r = root(&mut parent, f);
        out[r]
            .get_or_insert_with(|| Cell {
                scope: Scope {
                    families: BTreeSet::new(),
                    gpus: vec![],
                },
                tenants: vec![],
            })
            .scope
            .families
            .insert(family.clone());
    }
    for (t, fams) in requests.iter().enumerate() {
        let mut by_cell: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (r, &f) in fams.iter().enumerate() {
            by_cell.entry(root(&mut parent, f)).or_default().push(r);
        }
        for (c, rs) in by_cell {
            cell_at(&mut out, c).tenants.push((t, rs));
        }
    }
    let mut joined: Vec<usize> = Vec::new();
    for of_gpu in gpus.chunk_by(|a, b| a.0 == b.0) {
        joined.clear();
        for &(at, f) in of_gpu {
            let c = root(&mut parent, f);
            if !joined.contains(&c) {
                joined.push(c);
                cell_at(&mut out, c).scope.gpus.push(at);
            }
        }
    }
    let mut cells: Vec<Cell> = out.into_iter().flatten().collect();
    cells.sort_by(|a, b| a.scope.families.first().cmp(&b.scope.families.first()));
    cells
}

/// Per GPU, the families its planned layout offers capacity of: one entry per MIG instance
/// (repeats are harmless: a GPU joins each cell once), one for a GPU in any other mode.
/// One flat list, not a list per GPU: a fleet has hundreds of thousands of GPUs.
fn gpu_families<'a>(nodes: &'a [NodeDesired], families: &mut Families<'a>) -> Vec<(GpuRef, usize)> {
    let entries = nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .map(|g| g.mig_instances.len().max(1))
        .sum();
    let mut gpus: Vec<(GpuRef, usize)> = Vec::with_capacity(entries);
    for (n, node) in nodes.iter().enumerate() {
        for (g, spec) in node.gpus.iter().enumerate() {
            let at = (n as u32, g as u32);
            match spec.mode {
                Mode::Mig => gpus.extend(
                    spec.mig_instances
                        .iter()
                        .map(|i| (at, families.of(Mode::Mig, Some(&i.profile)))),
                ),
                m => gpus.push((at, families.of(m, None))),
            }
        }
    }
    gpus
}

fn cell_at(cells: &mut [Option<Cell>], root: usize) -> &mut Cell {
    cells[root].as_mut().expect("every family has a cell")
}
