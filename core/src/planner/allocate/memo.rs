//! The memo that lets a pass re-plan only the cells its change can affect.
//!
//! [`AllocationMemo`] keeps each cell's inputs and result from the last pass. A cell whose inputs
//! are equal (the requests of its tenants with everything their policies say, and every GPU of
//! its families: layout, dedication, what it is and what runs on it now) gets its last result
//! back without being placed again: the allocation is a pure function of those inputs. So does a
//! cell whose GPUs changed only in what runs on them, to what its last result bound there, when
//! every GPU of it runs that result (`AllocationMemo::stale_cells`).

use super::bound::Bound;
use super::cells::cells;
use super::merge::{cells_of_tenants, merge_tenant};
use super::report::{PlacedTenant, Positions};
use super::scope::Cell;
use super::units::{CellGrants, Family, GpuRef, GrantsByTenant, TenantGrants};
use crate::api::{GpuSpec, MigInstanceSpec};
use crate::inventory::NodeGpu;
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;
use foldhash::HashMap;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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
                ..GpuSpec::new(spec.index, spec.mode)
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
        self.matches_layout(node, g) && node.inventory.gpus.get(node.gpus[g].index as usize) == Some(&self.inventory)
    }

    /// [`GpuInput::matches`] but for what runs on the GPU now.
    fn matches_but_running(&self, node: &NodeDesired, g: usize) -> bool {
        self.matches_layout(node, g)
            && node
                .inventory
                .gpus
                .get(node.gpus[g].index as usize)
                .is_some_and(|now| same_but_running(&self.inventory, now))
    }

    /// The same layout, dedication and settings.
    fn matches_layout(&self, node: &NodeDesired, g: usize) -> bool {
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
    }
}

/// How a GPU differs from the last pass's read of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Same,
    /// Only what runs on it now: its mode, MIG instances and the tenants holding it or them.
    Running,
    Other,
}

/// How each GPU of the fleet differs from the last pass's read, in one list: by node, then GPU
/// position (a list per node was 5,000 allocations a pass, nearly all of them all `Same`).
#[derive(Default)]
struct FleetChanges {
    gpus: Vec<Change>,
    /// Where each node's GPUs start in `gpus`.
    starts: Vec<usize>,
}

impl FleetChanges {
    /// Starts the next node's GPUs.
    fn next_node(&mut self) {
        self.starts.push(self.gpus.len());
    }

    /// GPU `g` of node `n`; `None` past the fleet.
    fn get(&self, (n, g): GpuRef) -> Option<Change> {
        let start = *self.starts.get(n as usize)?;
        let end = self.starts.get(n as usize + 1).copied().unwrap_or(self.gpus.len());
        (start + (g as usize) < end).then(|| self.gpus[start + g as usize])
    }

    /// GPU `g` of node `n`, which the fleet has.
    fn at(&self, at: GpuRef) -> Change {
        self.get(at).expect("a GPU of the fleet")
    }
}

/// Whether `a` and `b` are the same GPU, what runs on it now aside: every field compared, so a
/// field added to [`NodeGpu`] must be added here.
fn same_but_running(a: &NodeGpu, b: &NodeGpu) -> bool {
    let NodeGpu {
        index,
        model,
        name,
        memory_mib,
        numa_node,
        compute_capability,
        uuid,
        instances: _,
        instance_tenants: _,
        mode: _,
        tenants: _,
        shares: _,
        profile_memory_mib,
    } = a;
    *index == b.index
        && *model == b.model
        && *name == b.name
        && *memory_mib == b.memory_mib
        && *numa_node == b.numa_node
        && *compute_capability == b.compute_capability
        && *uuid == b.uuid
        && *profile_memory_mib == b.profile_memory_mib
}

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

/// A tenant's grants as the last pass merged them from its cells' ([`super::merge::merge_tenant`]).
struct MergedTenant {
    /// Its cells (index in that pass's cells) with its requests in each.
    cells: Vec<(usize, Vec<usize>)>,
    grants: Arc<TenantGrants>,
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
    /// How each GPU of the fleet differs from the last pass's read, by node and GPU position.
    changed: FleetChanges,
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
        let stale = self.stale_cells(&cells, tenants, &changed, nodes);
        self.changed = changed;
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

    /// Per cell whether it must be placed again: new, over other GPUs, with other tenants, or
    /// with a GPU changed. A GPU where only what runs now changed, to what the cell's last result
    /// bound there, leaves the cell as it was when every GPU of it runs its result then: placing
    /// from a result as what runs now gives it back (the planner's fixed point, docs/design.md#invariants), so
    /// an agent applying the last plan costs the cell no placing.
    fn stale_cells(
        &mut self,
        cells: &[Cell],
        tenants: &[TenantProfile],
        changed: &FleetChanges,
        nodes: &[NodeDesired],
    ) -> Vec<bool> {
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

    /// Compares every GPU with the last pass's (not those of a node taken back at its revision),
    /// keeps this pass's, and says which changed, and whether the fleet's GPUs offer what the
    /// last pass read them to offer (the same nodes in the same order, each with as many GPUs, each
    /// GPU in the same mode with the same MIG profiles): what [`cells`] splits the fleet by. A
    /// GPU whose memory, dedication or settings changed is placed again in its cell; the cells
    /// stay.
    fn read_fleet(&mut self, nodes: &[NodeDesired]) -> (FleetChanges, bool) {
        let mut same = self.fleet.len() == nodes.len();
        self.fleet.truncate(nodes.len());
        // The last pass's lists, emptied: the same fleet fills them to the same length.
        let mut changed = std::mem::take(&mut self.changed);
        changed.gpus.clear();
        changed.starts.clear();
        for (n, node) in nodes.iter().enumerate() {
            changed.next_node();
            match self.fleet.get_mut(n) {
                Some(kept) if kept.name == node.inventory.name && kept.same_revision(node) => {
                    debug_assert!(
                        kept.gpus.len() == node.gpus.len()
                            && (0..node.gpus.len()).all(|g| kept.gpus[g].matches(node, g)),
                        "node {}: the same revision {:?} with other GPUs",
                        node.inventory.name,
                        node.inventory.revision
                    );
                    changed.gpus.extend(std::iter::repeat_n(Change::Same, node.gpus.len()));
                }
                Some(kept) if kept.name == node.inventory.name && kept.gpus.len() == node.gpus.len() => {
                    kept.revision.clone_from(&node.inventory.revision);
                    for (g, gpu) in kept.gpus.iter_mut().enumerate() {
                        if gpu.matches(node, g) {
                            changed.gpus.push(Change::Same);
                            continue;
                        }
                        same &= gpu.offers_same(node, g);
                        changed.gpus.push(if gpu.matches_but_running(node, g) {
                            Change::Running
                        } else {
                            Change::Other
                        });
                        *gpu = GpuInput::of(node, g);
                    }
                }
                kept => {
                    same = false;
                    match kept {
                        Some(k) => *k = NodeInput::of(node),
                        None => self.fleet.push(NodeInput::of(node)),
                    }
                    changed.gpus.extend(std::iter::repeat_n(Change::Other, node.gpus.len()));
                }
            }
        }
        (changed, same)
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
    /// again takes from it the grants of tenants placed as before ([`AllocationMemo::earlier_grants`]).
    pub(super) fn last_of(&mut self, cell: &Cell) -> Option<CellMemo> {
        self.cells.remove(&key(cell))
    }

    /// The grants `last` (the cell's memo, [`AllocationMemo::last_of`]) holds for `tenant`, taken
    /// out, when they are the ones `placed` gives now: the same positions, allocation, memory and
    /// shortfalls, and no GPU at those positions changed but for what runs on it (its node's name,
    /// the GPU's index and UUID, its MIG instances' profiles and placements are as read then, and
    /// a grant is made of nothing else). `None` builds them anew.
    pub(super) fn earlier_grants(
        &self,
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
        let unchanged = |at: GpuRef| self.changed.get(at).is_some_and(|c| c != Change::Other);
        if !placed.at.gpus().all(unchanged) {
            return None;
        }
        last.grants.remove(&tenant.name)
    }

    /// Remembers a cell just placed on `nodes` for its tenants' `profiles` ([`Cell::profiles`]),
    /// with its bindings as written there and its grants as built ([`super::report::Built`]);
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
        debug_assert!(
            bound.are_on(nodes, &cell.scope, &profiles),
            "bindings remembered that are not the nodes'"
        );
        let runs: Vec<bool> = cell
            .scope
            .gpus
            .iter()
            .enumerate()
            .map(|(j, &(n, g))| runs_on(&bound, j, &nodes[n as usize], g as usize, &profiles))
            .collect();
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
