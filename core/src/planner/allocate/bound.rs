//! What a placing pass binds on a cell's GPUs, held beside the nodes until a pass is kept.
//!
//! A cell is placed by several passes, and at 5,000 nodes the MPS cell's 12,000 GPUs are placed
//! again on every tenant's change. Bound on the nodes' GPU specs, every pass took each GPU's
//! tenants off and put them back: on a node taken back from the last pass, whose GPU list it
//! shares with the memo and the GpuNode read from the cluster, that copied the node's list
//! (`SharedVec`) even where the pass bound it as it was. Here a pass binds into a list of its
//! own, tenants by their position in the cell's tenants (no name copied), and only the pass kept
//! is written on the nodes, only where it differs: a node the cell binds as before keeps its
//! list, and is not looked at again by the steps after. The memo keeps the list to write it
//! again on nodes built anew.

use super::cell_nodes::CellNodes;
use super::holders::{Current, GpuHolders, PerHolder};
use super::scope::Scope;
use super::units::GpuRef;
use crate::api::{GpuSpec, Mode, SharedVec, TenantShares};
use crate::inventory::NodeGpu;
use crate::planner::changes::{instance_holder, whole_holders};
use crate::policy::TenantProfile;

/// A pass's bindings, per GPU of the cell in the order of its scope's GPUs (`Scope::gpus`);
/// tenants by their position in the cell's tenants (the `tenants` every method takes).
pub(super) struct Bound {
    gpus: Vec<BoundGpu>,
}

/// One GPU's bindings in the cell's families.
#[derive(Debug)]
struct BoundGpu {
    /// Tenants using the GPU whole, each with its shares where the GPU is shared; by name once
    /// the pass is finished ([`Bound::sort`]).
    whole: PerHolder<(u32, u32)>,
    shared: bool,
    /// The tenant of each of the cell's MIG instances on the GPU, by the instance's position.
    instances: Vec<(u32, Option<u32>)>,
    /// How many MIG instances the GPU has, of any cell.
    mig_count: u32,
}

/// The position of the GPU at `at` among `scope`'s GPUs (sorted, so found by bisection).
fn position(scope: &Scope, at: GpuRef) -> usize {
    scope
        .gpus
        .binary_search(&at)
        .expect("a pass binds only GPUs of its cell")
}

impl Bound {
    /// Nobody bound on any GPU of `scope`.
    pub fn none(nodes: &CellNodes, scope: &Scope) -> Bound {
        let gpus = scope.gpus.iter().map(|&(n, g)| {
            let spec = &nodes[n as usize].gpus[g as usize];
            BoundGpu {
                whole: PerHolder::new(),
                shared: false,
                instances: spec
                    .mig_instances
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| scope.has_mig(&i.profile))
                    .map(|(k, _)| (k as u32, None))
                    .collect(),
                mig_count: spec.mig_instances.len() as u32,
            }
        });
        Bound { gpus: gpus.collect() }
    }

    /// The bindings of the GPU at `at`.
    fn at(&mut self, scope: &Scope, at: GpuRef) -> &mut BoundGpu {
        &mut self.gpus[position(scope, at)]
    }

    /// Instance `inst` of the GPU at `at` to tenant `t`.
    pub fn instance(&mut self, scope: &Scope, at: GpuRef, inst: u32, t: usize) {
        let gpu = self.at(scope, at);
        if let Some((_, holder)) = gpu.instances.iter_mut().find(|(k, _)| *k == inst) {
            *holder = Some(t as u32);
        }
    }

    /// The GPU at `at`, used whole, to tenant `t`, with `count` more shares where `mode` shares it.
    pub fn whole(&mut self, scope: &Scope, at: GpuRef, mode: Mode, t: usize, count: u32) {
        self.whole_at(position(scope, at), mode, t, count);
    }

    /// [`Bound::whole`] for the `j`th GPU of the cell's scope: a shared pool knows its GPUs'
    /// positions, and binds tens of thousands of shares a pass in the MPS cell.
    pub fn whole_at(&mut self, j: usize, mode: Mode, t: usize, count: u32) {
        let gpu = &mut self.gpus[j];
        let shared = mode.is_shared();
        gpu.shared = shared;
        let add = if shared { count } else { 0 };
        match gpu.whole.iter_mut().find(|(w, _)| *w == t as u32) {
            Some((_, shares)) => *shares += add,
            None => gpu.whole.push((t as u32, add)),
        }
    }

    /// Each GPU's whole-GPU tenants by name, as a finished pass leaves them.
    pub fn sort(&mut self, tenants: &[TenantProfile]) {
        for g in &mut self.gpus {
            if g.whole.len() > 1 {
                g.whole
                    .sort_by(|a, b| tenants[a.0 as usize].name.cmp(&tenants[b.0 as usize].name));
            }
        }
    }

    /// The bindings as if they ran now: where a placing pass from them starts.
    pub fn holders<'t>(&self, tenants: &'t [TenantProfile]) -> Current<'t> {
        let name = |t: u32| tenants[t as usize].name.as_str();
        let gpus = self.gpus.iter().map(|g| {
            let mut whole: PerHolder<(&str, u32)> = g.whole.iter().map(|&(t, s)| (name(t), s)).collect();
            whole.sort();
            let mut instances = vec![None; g.mig_count as usize];
            for &(k, t) in &g.instances {
                instances[k as usize] = t.map(name);
            }
            GpuHolders {
                shares: whole.iter().map(|w| w.1).collect(),
                whole: whole.into_iter().map(|w| w.0).collect(),
                instances,
            }
        });
        Current::of(gpus.collect())
    }

    /// Writes the bindings on `nodes` where they differ from what the GPUs carry; `changed` is
    /// called with the position of the node of each GPU written on.
    pub fn write(&self, nodes: &mut CellNodes, scope: &Scope, tenants: &[TenantProfile], mut changed: impl FnMut(u32)) {
        for (j, &(n, g)) in scope.gpus.iter().enumerate() {
            if self.apply(j, &mut nodes[n as usize].gpus, g as usize, tenants) {
                changed(n);
            }
        }
    }

    /// Writes the bindings of the `j`th GPU on GPU `g` of `gpus` where they differ: a list
    /// shared with the last pass is copied only for a change. Whether it wrote.
    pub fn apply(&self, j: usize, gpus: &mut SharedVec<GpuSpec>, g: usize, tenants: &[TenantProfile]) -> bool {
        let bound = &self.gpus[j];
        let differ = !bound.is_on(&gpus[g], tenants);
        if differ {
            bound.write(&mut gpus[g], tenants);
        }
        differ
    }

    /// Whether the `j`th GPU, planned as `spec`, runs now (`inv`) what these bindings bind on it:
    /// a placing pass would find them its holders (`Current::from_inventory`, GPU by GPU).
    pub fn runs_on(&self, j: usize, spec: &GpuSpec, inv: &NodeGpu, tenants: &[TenantProfile]) -> bool {
        let bound = &self.gpus[j];
        let name = |t: u32| tenants[t as usize].name.as_str();
        let whole = whole_holders(inv, spec.mode);
        whole.len() == bound.whole.len()
            && whole
                .iter()
                .zip(&bound.whole)
                .all(|(holder, &(t, count))| holder == name(t) && inv.shares.get(holder).copied().unwrap_or(0) == count)
            && bound
                .instances
                .iter()
                .all(|&(k, t)| instance_holder(inv, &spec.mig_instances[k as usize]) == t.map(name))
    }

    /// Whether every GPU of `scope` on `nodes` carries these bindings.
    pub fn are_on(
        &self,
        nodes: &[crate::planner::nodes::NodeDesired],
        scope: &Scope,
        tenants: &[TenantProfile],
    ) -> bool {
        scope
            .gpus
            .iter()
            .zip(&self.gpus)
            .all(|(&(n, g), b)| b.is_on(&nodes[n as usize].gpus[g as usize], tenants))
    }
}

impl BoundGpu {
    fn is_on(&self, spec: &GpuSpec, tenants: &[TenantProfile]) -> bool {
        let name = |t: u32| tenants[t as usize].name.as_str();
        let whole_on = || {
            spec.tenants.len() == self.whole.len()
                && spec.tenants.iter().zip(&self.whole).all(|(s, &(t, _))| s == name(t))
                && if self.shared {
                    spec.shares.len() == self.whole.len()
                        && spec
                            .shares
                            .iter()
                            .zip(&self.whole)
                            .all(|(s, &(t, count))| s.tenant == name(t) && s.count == count)
                } else {
                    spec.shares.is_empty()
                }
        };
        (spec.mode == Mode::Mig || whole_on())
            && self
                .instances
                .iter()
                .all(|&(k, t)| spec.mig_instances[k as usize].tenant.as_deref() == t.map(name))
    }

    fn write(&self, spec: &mut GpuSpec, tenants: &[TenantProfile]) {
        let name = |t: u32| tenants[t as usize].name.clone();
        if spec.mode != Mode::Mig {
            spec.tenants = self.whole.iter().map(|&(t, _)| name(t)).collect();
            spec.shares = if self.shared {
                let shares = self
                    .whole
                    .iter()
                    .map(|&(t, count)| TenantShares { tenant: name(t), count });
                shares.collect()
            } else {
                Vec::new()
            };
        }
        for &(k, t) in &self.instances {
            spec.mig_instances[k as usize].tenant = t.map(name);
        }
    }
}
