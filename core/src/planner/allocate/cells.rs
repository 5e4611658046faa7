//! Independent parts of the allocation, and the memo that lets a pass re-plan only the parts its
//! change can affect.
//!
//! Every grant comes from a pool of one family of capacity (a MIG profile, exclusive GPUs, MPS or
//! time-slicing shares), and a request draws from its own family only. Families meet only in a
//! tenant's memory limit, which counts memory across all of its requests. So the families fall
//! into cells (families joined by some memory-limited tenant asking for both), and each cell is
//! placed on its own: the tenants' requests in it, over the GPUs and MIG instances of its families,
//! in the same priority, fair-share and node order as the whole fleet would be. The result of the
//! fleet is the union of the cells'.
//!
//! [`AllocationMemo`] keeps each cell's inputs and result from the last pass. A cell whose inputs
//! are equal (the requests of its tenants with everything their policies say, and every GPU of
//! its families: layout, dedication, what it is and what runs on it now) gets its last result
//! back without being placed again: the allocation is a pure function of those inputs.

use super::report::{cells_of_tenants, merge_tenant};
use super::scope::{Cell, Scope};
use super::{CellGrants, Family, GpuRef, TenantGrants};
use crate::api::{GpuSpec, MigInstanceSpec, Mode, ScrubMemory, SharedVec, TenantShares};
use crate::inventory::NodeGpu;
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
    // Per GPU, the families its planned layout offers capacity of: one entry per MIG instance
    // (repeats are harmless: a GPU joins each cell once, below), one for a GPU in any other mode.
    // One flat list, not a list per GPU: a fleet has hundreds of thousands of GPUs.
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

fn cell_at(cells: &mut [Option<Cell>], root: usize) -> &mut Cell {
    cells[root].as_mut().expect("every family has a cell")
}

/// One GPU as an allocation reads it, before any binding is written.
#[derive(Clone, Debug, PartialEq)]
struct GpuInput {
    spec: GpuSpec,
    dedicated: Vec<String>,
    inventory: NodeGpu,
}

/// One node's GPUs as the last pass read them.
struct NodeInput {
    name: String,
    /// The node's inventory revision then.
    revision: Option<String>,
    gpus: Vec<GpuInput>,
}

impl NodeInput {
    fn of(node: &NodeDesired) -> NodeInput {
        NodeInput {
            name: node.inventory.name.clone(),
            revision: node.inventory.revision.clone(),
            gpus: (0..node.gpus.len()).map(|g| GpuInput::of(node, g)).collect(),
        }
    }

    /// The node is as the last pass read it without comparing its GPUs: the nodes memo took it
    /// back (the same revision, and no plan that changed since reaches it), and this memo read
    /// it at that revision.
    fn same_revision(&self, node: &NodeDesired) -> bool {
        node.kept && self.revision.is_some() && self.revision == node.inventory.revision
    }
}

impl GpuInput {
    /// The GPU's layout without bindings or scrub policy: those are what the allocation writes (a
    /// node taken back from the last pass carries them), not what it reads.
    fn of(node: &NodeDesired, g: usize) -> GpuInput {
        let spec = &node.gpus[g];
        GpuInput {
            spec: GpuSpec {
                index: spec.index,
                mode: spec.mode,
                mig_instances: spec
                    .mig_instances
                    .iter()
                    .map(|i| MigInstanceSpec {
                        tenant: None,
                        ..i.clone()
                    })
                    .collect(),
                mps: spec.mps.clone(),
                time_slicing: spec.time_slicing.clone(),
                tenants: vec![],
                shares: vec![],
                scrub: ScrubMemory::default(),
            },
            dedicated: node.dedicated[g].clone(),
            inventory: node.inventory.gpus[spec.index as usize].clone(),
        }
    }

    /// Whether GPU `g` of `node` offers the families this one did: the same mode and MIG profiles.
    fn offers_same(&self, node: &NodeDesired, g: usize) -> bool {
        let spec = &node.gpus[g];
        self.spec.mode == spec.mode
            && self.spec.mig_instances.len() == spec.mig_instances.len()
            && self
                .spec
                .mig_instances
                .iter()
                .zip(&spec.mig_instances)
                .all(|(a, b)| a.profile == b.profile)
    }

    fn matches(&self, node: &NodeDesired, g: usize) -> bool {
        let spec = &node.gpus[g];
        let kept = &self.spec;
        kept.index == spec.index
            && kept.mode == spec.mode
            && kept.mps == spec.mps
            && kept.time_slicing == spec.time_slicing
            && kept.mig_instances.len() == spec.mig_instances.len()
            && kept
                .mig_instances
                .iter()
                .zip(&spec.mig_instances)
                .all(|(a, b)| a.profile == b.profile && a.placement == b.placement)
            && self.dedicated == node.dedicated[g]
            && node.inventory.gpus.get(spec.index as usize) == Some(&self.inventory)
    }
}

/// What a cell's allocation wrote on one GPU: its whole-GPU tenants and shares (a GPU not in MIG
/// mode belongs to one family), or the tenants of its instances of the cell's families.
#[derive(Clone, Debug)]
pub(super) struct GpuBindings {
    tenants: Vec<String>,
    shares: Vec<TenantShares>,
    instances: Vec<(usize, Option<String>)>,
}

impl GpuBindings {
    pub fn of(spec: &GpuSpec, scope: &Scope) -> GpuBindings {
        GpuBindings {
            tenants: spec.tenants.clone(),
            shares: spec.shares.clone(),
            instances: spec
                .mig_instances
                .iter()
                .enumerate()
                .filter(|(_, i)| scope.has_mig(&i.profile))
                .map(|(k, i)| (k, i.tenant.clone()))
                .collect(),
        }
    }

    /// Whether none of `scope`'s families binds a tenant on the GPU, found without copying
    /// anything.
    fn none_on(spec: &GpuSpec, scope: &Scope) -> bool {
        (spec.mode == Mode::Mig || (spec.tenants.is_empty() && spec.shares.is_empty()))
            && spec
                .mig_instances
                .iter()
                .all(|i| i.tenant.is_none() || !scope.has_mig(&i.profile))
    }

    /// Takes every tenant of `scope`'s families off GPU `g` of `gpus`, copying a list shared with
    /// the last pass only where one is bound.
    pub fn unbind(gpus: &mut SharedVec<GpuSpec>, g: usize, scope: &Scope) {
        if Self::none_on(&gpus[g], scope) {
            return;
        }
        let spec = &mut gpus[g];
        if spec.mode != Mode::Mig {
            spec.tenants.clear();
            spec.shares.clear();
        }
        for i in &mut spec.mig_instances {
            if scope.has_mig(&i.profile) {
                i.tenant = None;
            }
        }
    }

    /// Writes these bindings on GPU `g` of `gpus`, where they differ: a list shared with the last
    /// pass ([`crate::api::SharedVec`]) is copied only for a change.
    pub fn apply(&self, gpus: &mut SharedVec<GpuSpec>, g: usize) {
        if !self.is_on(&gpus[g]) {
            self.write(&mut gpus[g]);
        }
    }

    fn is_on(&self, spec: &GpuSpec) -> bool {
        (spec.mode == Mode::Mig || (spec.tenants == self.tenants && spec.shares == self.shares))
            && self.instances.iter().all(|(k, t)| spec.mig_instances[*k].tenant == *t)
    }

    fn write(&self, spec: &mut GpuSpec) {
        if spec.mode != Mode::Mig {
            spec.tenants.clone_from(&self.tenants);
            spec.shares.clone_from(&self.shares);
        }
        for (k, t) in &self.instances {
            spec.mig_instances[*k].tenant.clone_from(t);
        }
    }
}

/// A cell's inputs and result from an earlier pass.
struct CellMemo {
    gpus: Vec<GpuRef>,
    tenants: Vec<TenantProfile>,
    bindings: Vec<GpuBindings>,
    grants: BTreeMap<String, CellGrants>,
}

/// A tenant's grants as the last pass merged them from its cells' ([`super::report::merge_tenant`]).
struct MergedTenant {
    /// Its cells (index in that pass's cells) with its requests in each.
    cells: Vec<(usize, Vec<usize>)>,
    grants: TenantGrants,
}

/// Per tenant in order, the family of each request and whether a memory limit ties them
/// together: what [`cells`] splits the fleet by besides the GPUs (which
/// [`AllocationMemo::read_fleet`] compares).
type TenantFamilies = Vec<(Vec<Family>, bool)>;

/// The fleet's GPUs as the last pass read them, and each cell's tenants and result, by the cell's
/// families. Kept by the controller between passes; a planner run without one places every cell.
#[derive(Default)]
pub struct AllocationMemo {
    fleet: Vec<NodeInput>,
    cells: HashMap<Vec<Family>, CellMemo>,
    /// The last pass's cells, in order, and each tenant's grants merged from them.
    cell_keys: Vec<Vec<Family>>,
    merged: foldhash::HashMap<String, MergedTenant>,
    /// Tenants whose grants in a cell placed this pass are not what that cell gave them in the
    /// last pass: only their merged grants are built again.
    regranted: foldhash::HashSet<String>,
    /// The last pass's cells, and its tenants' families.
    last_cells: Option<Vec<Cell>>,
    families: TenantFamilies,
    /// Cells placed, and cells taken from the memo, in the last pass.
    pub placed: usize,
    pub reused: usize,
}

impl AllocationMemo {
    /// The pass's cells, and per cell whether it must be placed again: it is new, or one of its
    /// GPUs or tenants is not as in the last pass. Takes the nodes as the planner built them,
    /// before any binding is written, and keeps them for the next pass. The cells are the last
    /// pass's when every GPU offers what it did (mode and MIG profiles: a node's memory or a
    /// GPU's UUID changing leaves them) and every tenant requests the same families as then.
    pub(super) fn cells_and_stale(
        &mut self,
        tenants: &[TenantProfile],
        nodes: &[NodeDesired],
    ) -> (Vec<Cell>, Vec<bool>) {
        self.regranted.clear();
        let (changed, same_offers) = self.read_fleet(nodes);
        let same_families = self.read_families(tenants);
        let cells = match self.last_cells.take() {
            Some(last) if same_offers && same_families => last,
            _ => cells(tenants, nodes),
        };
        let stale = self.stale_cells(&cells, tenants, &changed);
        (cells, stale)
    }

    /// Keeps the pass's cells for the next pass.
    pub(super) fn keep_cells(&mut self, cells: Vec<Cell>) {
        self.last_cells = Some(cells);
    }

    /// Whether every tenant requests the same families as in the last pass; keeps this pass's
    /// (built again only when they differ).
    fn read_families(&mut self, tenants: &[TenantProfile]) -> bool {
        let same = self.families.len() == tenants.len()
            && self.families.iter().zip(tenants).all(|((of, limited), t)| {
                *limited == t.memory_limit_mib.is_some()
                    && of.len() == t.requests.len()
                    && of
                        .iter()
                        .zip(&t.requests)
                        .all(|(f, r)| f.is(r.mode, r.profile.as_deref()))
            });
        if !same {
            self.families = tenants
                .iter()
                .map(|t| {
                    let of = t.requests.iter().map(|r| Family::of(r.mode, r.profile.as_deref()));
                    (of.collect(), t.memory_limit_mib.is_some())
                })
                .collect();
        }
        same
    }

    fn stale_cells(&self, cells: &[Cell], tenants: &[TenantProfile], changed: &[Vec<bool>]) -> Vec<bool> {
        cells
            .iter()
            .map(|cell| match self.cells.get(&key(cell)) {
                Some(m) => {
                    m.gpus != cell.scope.gpus
                        || cell.scope.gpus.iter().any(|&(n, g)| changed[n as usize][g as usize])
                        || m.tenants.len() != cell.tenants.len()
                        || m.tenants
                            .iter()
                            .zip(&cell.tenants)
                            .any(|(kept, (t, requests))| !same_profile(kept, &tenants[*t], requests))
                }
                None => true,
            })
            .collect()
    }

    /// Compares every GPU with the last pass's (not those of a node taken back at its revision),
    /// keeps this pass's, and says which changed, and whether the fleet's GPUs offer what the
    /// last pass read them to offer (the same nodes in the same order, each with as many GPUs, each
    /// GPU in the same mode with the same MIG profiles): what [`cells`] splits the fleet by. A
    /// GPU whose memory, dedication or settings changed is placed again in its cell; the cells
    /// stay.
    fn read_fleet(&mut self, nodes: &[NodeDesired]) -> (Vec<Vec<bool>>, bool) {
        let mut same = self.fleet.len() == nodes.len();
        self.fleet.truncate(nodes.len());
        let changed: Vec<Vec<bool>> = nodes
            .iter()
            .enumerate()
            .map(|(n, node)| match self.fleet.get_mut(n) {
                Some(kept) if kept.name == node.inventory.name && kept.same_revision(node) => {
                    debug_assert!(
                        kept.gpus.len() == node.gpus.len()
                            && (0..node.gpus.len()).all(|g| kept.gpus[g].matches(node, g)),
                        "node {}: the same revision {:?} with other GPUs",
                        node.inventory.name,
                        node.inventory.revision
                    );
                    vec![false; node.gpus.len()]
                }
                Some(kept) if kept.name == node.inventory.name && kept.gpus.len() == node.gpus.len() => {
                    kept.revision.clone_from(&node.inventory.revision);
                    kept.gpus
                        .iter_mut()
                        .enumerate()
                        .map(|(g, gpu)| {
                            let unchanged = gpu.matches(node, g);
                            if !unchanged {
                                same &= gpu.offers_same(node, g);
                                *gpu = GpuInput::of(node, g);
                            }
                            !unchanged
                        })
                        .collect()
                }
                kept => {
                    same = false;
                    match kept {
                        Some(k) => *k = NodeInput::of(node),
                        None => self.fleet.push(NodeInput::of(node)),
                    }
                    vec![true; node.gpus.len()]
                }
            })
            .collect();
        (changed, same)
    }

    /// Writes a remembered cell's bindings on `nodes`.
    /// (Nodes taken back from the last pass carry them already.)
    pub(super) fn recall(&self, cell: &Cell, nodes: &mut [NodeDesired]) {
        let m = &self.cells[&key(cell)];
        for (&(n, g), b) in m.gpus.iter().zip(&m.bindings) {
            let node = &mut nodes[n as usize];
            if !node.kept {
                b.apply(&mut node.gpus, g as usize);
            }
        }
    }

    /// Remembers a cell just placed on `nodes` for its tenants' `profiles` ([`Cell::profiles`]).
    pub(super) fn remember(
        &mut self,
        cell: &Cell,
        profiles: Vec<TenantProfile>,
        nodes: &[NodeDesired],
        grants: BTreeMap<String, CellGrants>,
    ) {
        let bindings = cell
            .scope
            .gpus
            .iter()
            .map(|&(n, g)| GpuBindings::of(&nodes[n as usize].gpus[g as usize], &cell.scope))
            .collect();
        let key = key(cell);
        match self.cells.get(&key) {
            Some(last) => {
                let moved = grants
                    .iter()
                    .filter(|(name, g)| last.grants.get(*name) != Some(*g))
                    .map(|(name, _)| name);
                let gone = last.grants.keys().filter(|name| !grants.contains_key(*name));
                self.regranted.extend(moved.chain(gone).cloned());
            }
            None => self.regranted.extend(grants.keys().cloned()),
        }
        self.cells.insert(
            key,
            CellMemo {
                gpus: cell.scope.gpus.clone(),
                tenants: profiles,
                bindings,
                grants,
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
    pub(super) fn merge(
        &mut self,
        tenants: &[TenantProfile],
        cells: &[Cell],
        stale: &[bool],
    ) -> BTreeMap<String, TenantGrants> {
        let keys: Vec<Vec<Family>> = cells.iter().map(key).collect();
        let same_cells = keys == self.cell_keys;
        let mut parts: Vec<Cow<'_, BTreeMap<String, CellGrants>>> =
            keys.iter().map(|k| Cow::Borrowed(&self.cells[k].grants)).collect();
        let of_tenants = cells_of_tenants(tenants, cells);
        let mut out = BTreeMap::new();
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
                    let grants = merge_tenant(t, of, &mut parts);
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
