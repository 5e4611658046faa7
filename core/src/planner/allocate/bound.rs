//! What a placing pass binds on a cell's GPUs, held beside the nodes until a pass is kept.
//!
//! A cell is placed by several passes, and at 5,000 nodes the MPS cell's 12,000 GPUs are placed
//! again on every tenant's change. Bound on the nodes' GPU specs, every pass took each GPU's
//! tenants off and put them back: on a node taken back from the last pass, whose GPU list it
//! shares with the memo and the GpuNode read from the cluster, that copied the node's list
//! (`SharedVec`) even where the pass bound it as it was. Here a pass binds into a list of its
//! own, and only the pass kept is written on the nodes, only where it differs: a node the cell
//! binds as before keeps its list, and is not looked at again by the steps after.

use super::cell_nodes::CellNodes;
use super::cells::GpuBindings;
use super::holders::{Current, GpuHolders};
use super::scope::Scope;
use super::units::GpuRef;
use crate::api::Mode;

/// A pass's bindings, per GPU of the cell in the order of its scope's GPUs (`Scope::gpus`).
pub(super) struct Bound {
    gpus: Vec<GpuBindings>,
    /// Per GPU, how many MIG instances it has (of any cell).
    instances: Vec<usize>,
}

impl Bound {
    /// Nobody bound on any GPU of `scope`.
    pub fn none(nodes: &CellNodes, scope: &Scope) -> Bound {
        let spec = |&(n, g): &GpuRef| &nodes[n as usize].gpus[g as usize];
        Bound {
            gpus: scope
                .gpus
                .iter()
                .map(|at| GpuBindings::none_of(spec(at), scope))
                .collect(),
            instances: scope.gpus.iter().map(|at| spec(at).mig_instances.len()).collect(),
        }
    }

    /// The bindings of the GPU at `at` (`scope.gpus` is sorted, so found by bisection).
    fn at(&mut self, scope: &Scope, at: GpuRef) -> &mut GpuBindings {
        let j = scope
            .gpus
            .binary_search(&at)
            .expect("a pass binds only GPUs of its cell");
        &mut self.gpus[j]
    }

    /// Instance `inst` of the GPU at `at` to `tenant`.
    pub fn instance(&mut self, scope: &Scope, at: GpuRef, inst: u32, tenant: &str) {
        self.at(scope, at).bind_instance(inst as usize, tenant);
    }

    /// The GPU at `at`, used whole, to `tenant`, with `count` more shares where `mode` shares it.
    pub fn whole(&mut self, scope: &Scope, at: GpuRef, mode: Mode, tenant: &str, count: u32) {
        self.at(scope, at).bind_whole(tenant, mode.is_shared().then_some(count));
    }

    /// Each GPU's whole-GPU tenants by name, as a finished pass leaves them.
    pub fn sort(&mut self) {
        for g in &mut self.gpus {
            g.sort();
        }
    }

    /// The bindings as if they ran now: where a placing pass from them starts.
    pub fn holders(&self) -> Current {
        let gpus = self.gpus.iter().zip(&self.instances);
        Current::of(gpus.map(|(b, &n)| GpuHolders::of(b, n)).collect())
    }

    /// Writes the bindings on `nodes` where they differ from what the GPUs carry. Calls
    /// `changed` with the position of each node written on, once per GPU written.
    pub fn write(&self, nodes: &mut CellNodes, scope: &Scope, mut changed: impl FnMut(u32)) {
        for (&(n, g), b) in scope.gpus.iter().zip(&self.gpus) {
            if b.apply(&mut nodes[n as usize].gpus, g as usize) {
                changed(n);
            }
        }
    }

    /// Each GPU's bindings, in the order of the scope's GPUs (for the memo).
    pub fn into_gpus(self) -> Vec<GpuBindings> {
        self.gpus
    }
}
