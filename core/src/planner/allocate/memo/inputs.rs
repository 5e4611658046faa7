//! What the last pass read, against which a pass reads its inputs: the fleet's GPUs (how each
//! changed since), the families each tenant requests, and the cells these split the allocation
//! into, kept while neither changes.

use crate::api::{GpuSpec, MigInstanceSpec};
use crate::inventory::NodeGpu;
use crate::planner::allocate::cells::cells;
use crate::planner::allocate::scope::Cell;
use crate::planner::allocate::units::{Family, GpuRef};
use crate::planner::nodes::NodeDesired;
use crate::policy::TenantProfile;

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
pub(super) enum Change {
    Same,
    /// Only what runs on it now: its mode, MIG instances and the tenants holding it or them.
    Running,
    Other,
}

/// How each GPU of the fleet differs from the last pass's read, in one list: by node, then GPU
/// position (a list per node was 5,000 allocations a pass, nearly all of them all `Same`).
#[derive(Default)]
pub(super) struct FleetChanges {
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
    pub(super) fn get(&self, (n, g): GpuRef) -> Option<Change> {
        let start = *self.starts.get(n as usize)?;
        let end = self.starts.get(n as usize + 1).copied().unwrap_or(self.gpus.len());
        (start + (g as usize) < end).then(|| self.gpus[start + g as usize])
    }

    /// GPU `g` of node `n`, which the fleet has.
    pub(super) fn at(&self, at: GpuRef) -> Change {
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

/// Per tenant in order, the family of each request and whether a memory limit ties them
/// together: what [`cells`] splits the fleet by besides the GPUs (which
/// [`LastInputs::read_fleet`] compares).
type TenantFamilies = Vec<(Vec<Family>, bool)>;

/// The fleet's GPUs and the tenants' families as the last pass read them, how each GPU differs
/// from that read in this pass, and the pass's cells.
#[derive(Default)]
pub(super) struct LastInputs {
    fleet: Vec<NodeInput>,
    /// How each GPU of the fleet differs from the last pass's read, by node and GPU position.
    changed: FleetChanges,
    families: TenantFamilies,
    /// The pass's cells (the last pass's until [`LastInputs::read`]).
    cells: Vec<Cell>,
}

impl LastInputs {
    /// Reads the pass's inputs against the last pass's, and keeps them for the next pass: how each
    /// GPU changed, and the pass's cells. Takes the nodes as the planner built them, before any
    /// binding is written. The cells are the last pass's when every GPU offers what it did (mode
    /// and MIG profiles: a node's memory or a GPU's UUID changing leaves them) and every tenant
    /// requests the same families as then.
    pub(super) fn read(&mut self, tenants: &[TenantProfile], nodes: &[NodeDesired]) {
        let (changed, same_offers) = self.read_fleet(nodes);
        let same_families = self.read_families(tenants);
        if !(same_offers && same_families) {
            self.cells = cells(tenants, nodes);
        }
        self.changed = changed;
    }

    /// The pass's cells, once read.
    pub(super) fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// How each GPU of the fleet differs from the last pass's read, once read.
    pub(super) fn changed(&self) -> &FleetChanges {
        &self.changed
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
}
