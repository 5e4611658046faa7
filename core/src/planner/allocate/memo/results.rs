//! What each cell's last placing gave: its inputs (tenants and GPUs) and result (bindings and
//! grants), which cells a pass must place again for it, and each tenant's grants merged from its
//! cells'.

use super::inputs::{Change, FleetChanges};
use crate::planner::allocate::bound::Bound;
use crate::planner::allocate::cell_nodes::CellNodes;
use crate::planner::allocate::merge::{cells_of_tenants, merge_tenant};
use crate::planner::allocate::place::allocate_cell;
use crate::planner::allocate::report::{PlacedTenant, Positions};
use crate::planner::allocate::scope::Cell;
use crate::planner::allocate::units::{CellGrants, Family, GpuRef, GrantsByTenant, TenantGrants};
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;
use foldhash::HashMap;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A cell's inputs and result from an earlier pass.
pub(super) struct CellMemo {
    gpus: Vec<GpuRef>,
    tenants: Vec<TenantProfile>,
    /// Tenants by their position in `tenants`.
    bindings: Bound,
    /// Per GPU (as `gpus`), whether what runs on it now is what `bindings` bind there; and how
    /// many do not.
    runs: Vec<bool>,
    not_running: usize,
    grants: BTreeMap<String, CellGrants>,
    /// Per tenant (as `tenants`), the positions its grants were built from.
    positions: Vec<Positions>,
}

impl CellMemo {
    /// Reads again whether the `j`th GPU, GPU `g` of `node`, runs what the cell bound there.
    fn read_running(&mut self, j: usize, node: &NodeDesired, g: usize) {
        let runs = runs_on(&self.bindings, j, node, g, &self.tenants);
        if runs != self.runs[j] {
            self.runs[j] = runs;
            if runs {
                self.not_running -= 1;
            } else {
                self.not_running += 1;
            }
        }
    }
}

/// Whether GPU `g` of `node`, the `j`th of a cell bound as `bound`, runs now what is bound there.
fn runs_on(bound: &Bound, j: usize, node: &NodeDesired, g: usize, tenants: &[TenantProfile]) -> bool {
    let spec = &node.gpus[g];
    node.inventory
        .gpus
        .get(spec.index as usize)
        .is_some_and(|inv| bound.runs_on(j, spec, inv, tenants))
}

/// A tenant's grants as the last pass merged them from its cells' ([`merge_tenant`]).
struct MergedTenant {
    /// Its cells (index in that pass's cells) with its requests in each.
    cells: Vec<(usize, Vec<usize>)>,
    grants: Arc<TenantGrants>,
}

/// Each cell's inputs and result from the last pass, by the cell's families, and each tenant's
/// grants merged from them.
#[derive(Default)]
pub(super) struct CellResults {
    cells: HashMap<Vec<Family>, CellMemo>,
    /// The last pass's cells, in order, by their families, and each tenant's grants merged from them.
    cell_keys: Vec<Vec<Family>>,
    merged: foldhash::HashMap<String, MergedTenant>,
    /// Tenants whose grants in a cell placed this pass are not what that cell gave them in the
    /// last pass: only their merged grants are built again.
    regranted: foldhash::HashSet<String>,
}

impl CellResults {
    /// Starts a pass: per cell whether it must be placed again: new, over other GPUs, with other
    /// tenants, or with a GPU changed (as `changed` says). A GPU where only what runs now changed, to what the cell's last result
    /// bound there, leaves the cell as it was when every GPU of it runs its result then: placing
    /// from a result as what runs now gives it back (the planner's fixed point, docs/design.md#invariants), so
    /// an agent applying the last plan costs the cell no placing.
    pub(super) fn stale(
        &mut self,
        cells: &[Cell],
        tenants: &[TenantProfile],
        changed: &FleetChanges,
        nodes: &[NodeDesired],
    ) -> Vec<bool> {
        self.regranted.clear();
        cells
            .iter()
            .map(|cell| {
                let Some(m) = self.cells.get_mut(&key(cell)) else {
                    return true;
                };
                if m.gpus != cell.scope.gpus
                    || m.tenants.len() != cell.tenants.len()
                    || m.tenants
                        .iter()
                        .zip(&cell.tenants)
                        .any(|(kept, (t, requests))| !same_profile(kept, &tenants[*t], requests))
                {
                    return true;
                }
                for (j, &(n, g)) in cell.scope.gpus.iter().enumerate() {
                    match changed.at((n, g)) {
                        Change::Same => {}
                        Change::Other => return true,
                        Change::Running => m.read_running(j, &nodes[n as usize], g as usize),
                    }
                }
                m.not_running > 0 && cell.scope.gpus.iter().any(|&at| changed.at(at) != Change::Same)
            })
            .collect()
    }

    /// Places `cell` again and remembers it, its tenants' grants handed back where they are those
    /// of its last result (`changed`: how each GPU changed since the last pass). The nodes it
    /// writes on are marked recomputed; `recomputed` is a list to reuse.
    pub(super) fn place_again(
        &mut self,
        cell: &Cell,
        tenants: &[TenantProfile],
        nodes: &mut [NodeDesired],
        changed: &FleetChanges,
        recomputed: &mut Vec<u32>,
    ) {
        let profiles = cell.profiles(tenants);
        let mut view = CellNodes::fleet(nodes);
        let mut last = self.last_of(cell);
        let (grants, bound, positions, handed_back) = allocate_cell(&profiles, &view, &cell.scope, |placed| {
            placed.grants_with(&profiles, &view, |t, p| {
                self.earlier_grants(changed, last.as_mut(), &profiles[t], p)
            })
        });
        // A node the cell binds as the last pass did keeps its GPU list, and the steps after take it
        // back as they would had the cell not been placed.
        bound.write(&mut view, &cell.scope, &profiles, |n| {
            // Once, though several of its GPUs are written on.
            if recomputed.last() != Some(&n) {
                recomputed.push(n);
            }
        });
        drop(view);
        for &n in recomputed.iter() {
            nodes[n as usize].recomputed = true;
        }
        recomputed.clear();
        self.remember(cell, profiles, nodes, bound, (grants, positions, handed_back), last);
    }

    /// Writes a remembered cell's bindings on `nodes`.
    /// (Nodes taken back from the last pass carry them already.)
    pub(super) fn recall(&self, cell: &Cell, nodes: &mut [NodeDesired]) {
        let m = &self.cells[&key(cell)];
        for (j, &(n, g)) in m.gpus.iter().enumerate() {
            let node = &mut nodes[n as usize];
            if !node.kept {
                m.bindings.apply(j, &mut node.gpus, g as usize, &m.tenants);
            }
        }
    }

    /// The cell's inputs and result as last remembered, taken out to be replaced: a cell placed
    /// again takes from it the grants of tenants placed as before ([`CellResults::earlier_grants`]).
    pub(super) fn last_of(&mut self, cell: &Cell) -> Option<CellMemo> {
        self.cells.remove(&key(cell))
    }

    /// The grants `last` (the cell's memo, [`CellResults::last_of`]) holds for `tenant`, taken
    /// out, when they are the ones `placed` gives now: the same positions, allocation, memory and
    /// shortfalls, and no GPU at those positions changed but for what runs on it (its node's name,
    /// the GPU's index and UUID, its MIG instances' profiles and placements are as read then, and
    /// a grant is made of nothing else). `None` builds them anew.
    pub(super) fn earlier_grants(
        &self,
        changed: &FleetChanges,
        last: Option<&mut CellMemo>,
        tenant: &TenantProfile,
        placed: &PlacedTenant,
    ) -> Option<CellGrants> {
        let last = last?;
        let k = last
            .tenants
            .binary_search_by(|t| t.name.as_str().cmp(&tenant.name))
            .ok()?;
        if last.positions[k] != placed.at {
            return None;
        }
        let g = last.grants.get(&tenant.name)?;
        if g.memory_mib != placed.memory_mib || g.allocation != placed.allocation || g.shortfalls != placed.shortfalls {
            return None;
        }
        let unchanged = |at: GpuRef| changed.get(at).is_some_and(|c| c != Change::Other);
        if !placed.at.gpus().all(unchanged) {
            return None;
        }
        last.grants.remove(&tenant.name)
    }

    /// Remembers a cell just placed on `nodes` for its tenants' `profiles` ([`Cell::profiles`]),
    /// with its bindings as written there and its grants as built ([`Built`](crate::planner::allocate::report::Built));
    /// `last` is what it remembered of the cell before.
    pub(super) fn remember(
        &mut self,
        cell: &Cell,
        profiles: Vec<TenantProfile>,
        nodes: &[NodeDesired],
        bound: Bound,
        (grants, positions, handed_back): (BTreeMap<String, CellGrants>, Vec<Positions>, Vec<bool>),
        last: Option<CellMemo>,
    ) {
        let runs: Vec<bool> = cell
            .scope
            .gpus
            .iter()
            .enumerate()
            .map(|(j, &(n, g))| runs_on(&bound, j, &nodes[n as usize], g as usize, &profiles))
            .collect();
        debug_assert!(
            bound.are_on(nodes, &cell.scope, &profiles),
            "bindings remembered that are not the nodes'"
        );
        let not_running = runs.iter().filter(|r| !**r).count();
        // A tenant whose grants were handed back has them as the last pass did; the others are
        // compared with the last pass's (what is left of them).
        let built = profiles.iter().zip(&handed_back).filter(|(_, h)| !**h);
        match &last {
            Some(last) => {
                let moved = built
                    .map(|(p, _)| &p.name)
                    .filter(|name| last.grants.get(*name) != grants.get(*name));
                let gone = last.grants.keys().filter(|name| !grants.contains_key(*name));
                self.regranted.extend(moved.chain(gone).cloned());
            }
            None => self.regranted.extend(built.map(|(p, _)| p.name.clone())),
        }
        self.cells.insert(
            key(cell),
            CellMemo {
                gpus: cell.scope.gpus.clone(),
                runs,
                not_running,
                tenants: profiles,
                bindings: bound,
                grants,
                positions,
            },
        );
    }

    /// Forgets the cells this pass did not have.
    pub(super) fn keep_only(&mut self, cells: &[Cell]) {
        let live: BTreeSet<Vec<Family>> = cells.iter().map(key).collect();
        self.cells.retain(|k, _| live.contains(k));
    }

    /// Every tenant's grants from its cells', all remembered, `stale` those placed this pass. A
    /// tenant in the same cells with the same requests as in the last pass, given in each what
    /// it was given then, gets its last merged grants back (a list shared, not copied).
    pub(super) fn merge(&mut self, tenants: &[TenantProfile], cells: &[Cell], stale: &[bool]) -> GrantsByTenant {
        let keys: Vec<Vec<Family>> = cells.iter().map(key).collect();
        let same_cells = keys == self.cell_keys;
        let mut parts: Vec<Cow<'_, BTreeMap<String, CellGrants>>> =
            keys.iter().map(|k| Cow::Borrowed(&self.cells[k].grants)).collect();
        let of_tenants = cells_of_tenants(tenants, cells);
        let mut out = GrantsByTenant::with_capacity_and_hasher(tenants.len(), Default::default());
        for (t, of) in tenants.iter().zip(&of_tenants) {
            let kept = self.merged.get(&t.name).filter(|m| {
                same_cells
                    && m.cells.len() == of.len()
                    && m.cells
                        .iter()
                        .zip(of)
                        .all(|((c, r), (now, requests))| c == now && r == requests)
                    && !(m.cells.iter().any(|(c, _)| stale[*c]) && self.regranted.contains(&t.name))
            });
            let grants = match kept {
                Some(m) => m.grants.clone(),
                None => {
                    let grants = Arc::new(merge_tenant(t, of, &mut parts));
                    let merged = MergedTenant {
                        cells: of.iter().map(|(c, r)| (*c, r.to_vec())).collect(),
                        grants: grants.clone(),
                    };
                    self.merged.insert(t.name.clone(), merged);
                    grants
                }
            };
            out.insert(t.name.clone(), grants);
        }
        drop(parts);
        let names: foldhash::HashSet<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
        self.merged.retain(|name, _| names.contains(name.as_str()));
        self.cell_keys = keys;
        out
    }
}

/// Whether `kept` is `now` with only the requests at `requests`: every field compared, so a field
/// added to [`TenantProfile`] must be added here.
fn same_profile(kept: &TenantProfile, now: &TenantProfile, requests: &[usize]) -> bool {
    let TenantProfile {
        name,
        tier,
        priority,
        weight,
        co_location,
        scrub,
        memory_caps,
        requests: kept_requests,
        memory_limit_mib,
        headroom_percent,
        max_mps_clients,
        max_time_slicing_replicas,
        topology,
    } = kept;
    *name == now.name
        && *tier == now.tier
        && *priority == now.priority
        && *weight == now.weight
        && *co_location == now.co_location
        && *scrub == now.scrub
        && *memory_caps == now.memory_caps
        && *memory_limit_mib == now.memory_limit_mib
        && *headroom_percent == now.headroom_percent
        && *max_mps_clients == now.max_mps_clients
        && *max_time_slicing_replicas == now.max_time_slicing_replicas
        && *topology == now.topology
        && kept_requests.len() == requests.len()
        && kept_requests.iter().zip(requests).all(|(k, &r)| *k == now.requests[r])
}

fn key(cell: &Cell) -> Vec<Family> {
    cell.scope.families.iter().cloned().collect()
}
