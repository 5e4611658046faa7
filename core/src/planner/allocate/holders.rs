//! Who holds each unit of a cell's planned layout now, and how a placing pass uses that: the
//! state both the pools (built from it) and the sticky placing (which keeps it) read.

use super::cell_nodes::CellNodes;
use super::scope::Scope;
use super::units::{GpuRef, PoolKey};
use crate::planner::changes::{instance_holder, whole_holders};
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// How a placing pass uses a pool's current bindings, most sticky first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Placing {
    /// Every tenant keeps its units before anyone takes more.
    #[default]
    KeepFirst,
    /// Priority level by level: a level keeps and takes before the next keeps anything.
    ByLevel,
    /// Current bindings ignored: the blind pass's placement.
    Blind,
}

impl Placing {
    pub fn less_sticky(self) -> Option<Placing> {
        match self {
            Placing::KeepFirst => Some(Placing::ByLevel),
            Placing::ByLevel => Some(Placing::Blind),
            Placing::Blind => None,
        }
    }
}

/// Placing per pool; pools not listed are `KeepFirst`.
pub(super) type Placings = BTreeMap<PoolKey, Placing>;

/// Who holds each unit of the planned layout now, per GPU of the cell, in the order of its
/// scope's GPUs (`Scope::gpus`): a cell's GPUs are a fraction of a fleet of 400,000.
/// Empty where nobody holds anything (a fleet planned from empty): nothing to copy then.
/// Names are borrowed from what they are read from (the inventories, or the cell's tenants):
/// the MPS cell's 12,000 GPUs are read on every change.
#[derive(PartialEq)]
pub(super) struct Current<'h> {
    gpus: Vec<GpuHolders<'h>>,
    /// The holders of a GPU nobody holds (not a `static`: inline lists do not shorten their
    /// lifetime, so one of `'static` cannot stand for one of `'h`).
    nobody: GpuHolders<'h>,
}

/// A GPU's whole-GPU tenants, or something of each: one or two, held inline.
pub(super) type PerHolder<T> = SmallVec<[T; 2]>;

#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct GpuHolders<'h> {
    /// Tenants of the GPU used whole in its planned mode.
    pub whole: PerHolder<&'h str>,
    /// On a shared GPU, the shares each of `whole` holds (0: not known, at least one).
    pub shares: PerHolder<u32>,
    /// Tenant of each planned MIG instance.
    pub instances: Vec<Option<&'h str>>,
}

impl<'h> Current<'h> {
    /// Whether nobody holds any unit.
    pub fn holds_nothing(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Who holds the units of the `j`th GPU of the cell.
    pub fn gpu(&self, j: u32) -> &GpuHolders<'h> {
        self.gpus.get(j as usize).unwrap_or(&self.nobody)
    }

    /// The tenant holding instance `i` of the `j`th GPU of the cell.
    pub fn instance(&self, j: u32, i: u32) -> Option<&'h str> {
        *self.gpu(j).instances.get(i as usize)?
    }

    /// `gpus`, or none where nobody holds anything.
    pub fn of(gpus: Vec<GpuHolders<'h>>) -> Current<'h> {
        let nobody = gpus
            .iter()
            .all(|g| g.whole.is_empty() && g.instances.iter().all(Option::is_none));
        Current {
            gpus: if nobody { Vec::new() } else { gpus },
            nobody: GpuHolders::default(),
        }
    }

    /// From what the nodes run now: an instance counts when it exists now with the same profile
    /// and placement, a whole GPU when it is in the planned mode now.
    /// Of the GPUs of `scope` (nobody holds the others), and of its instances (another cell's
    /// on the same GPU are left to nobody: only the cell's pools read them).
    pub fn from_inventory(nodes: &'h CellNodes, scope: &Scope) -> Current<'h> {
        let at = &scope.gpus;
        // A GPU's planned spec and what runs on it now.
        let gpu = |&(n, g): &GpuRef| {
            let node = &nodes[n as usize];
            let spec = &node.gpus[g as usize];
            (spec, &node.inventory.gpus[spec.index as usize])
        };
        let holds = |at: &GpuRef| {
            let (spec, inv) = gpu(at);
            !whole_holders(inv, spec.mode).is_empty()
                || spec.mig_instances.iter().any(|i| instance_holder(inv, i).is_some())
        };
        if !at.iter().any(holds) {
            return Current::of(Vec::new());
        }
        // Some GPU has a holder: the list is kept whole.
        let gpus = at
            .iter()
            .map(|at| {
                let (spec, inv) = gpu(at);
                let whole: PerHolder<&str> = whole_holders(inv, spec.mode).iter().map(String::as_str).collect();
                GpuHolders {
                    shares: whole.iter().map(|t| inv.shares.get(*t).copied().unwrap_or(0)).collect(),
                    whole,
                    instances: spec
                        .mig_instances
                        .iter()
                        .map(|i| instance_holder(inv, i).filter(|_| scope.has_mig(&i.profile)))
                        .collect(),
                }
            })
            .collect();
        Current {
            gpus,
            nobody: GpuHolders::default(),
        }
    }
}
