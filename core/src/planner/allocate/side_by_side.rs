//! Cells placed side by side: cells that share no node are independent (each changes only the
//! bindings of its own GPUs, and reads nothing another writes), so a full pass places groups of
//! them on threads of their own. Within a group the cells keep their order; the result is the
//! same as one after the other (see the test below), only sooner on a machine with cores to spare.

use super::cell_nodes::CellNodes;
use super::cells::root;
use super::scope::Cell;
use crate::planner::nodes::NodeDesired;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

/// Below this many GPUs in the fleet's cells a thread's start costs more than it saves.
const MIN_GPUS: usize = 4096;

/// `place` of every cell, in cell order, on up to `threads` threads.
pub(super) fn place_cells<R: Send>(
    nodes: &mut [NodeDesired],
    cells: &[Cell],
    threads: usize,
    place: impl Fn(&Cell, &mut CellNodes) -> R + Sync,
) -> Vec<R> {
    let groups = groups(cells, nodes.len());
    // What a cell costs grows with its GPUs; a cell no tenant asks for costs next to nothing.
    let weight = |group: &[usize]| -> usize {
        group
            .iter()
            .filter(|&&c| !cells[c].tenants.is_empty())
            .map(|&c| cells[c].scope.gpus.len())
            .sum()
    };
    let busy = groups.iter().filter(|g| weight(g) > 0).count();
    let threads = threads.min(busy);
    if threads < 2 || groups.iter().map(|g| weight(g)).sum::<usize>() < MIN_GPUS {
        let mut all = CellNodes::fleet(nodes);
        return cells.iter().map(|c| place(c, &mut all)).collect();
    }
    // Each group gets the nodes its cells hold.
    let mut group_of_node: Vec<Option<usize>> = vec![None; nodes.len()];
    for (g, group) in groups.iter().enumerate() {
        for &c in group {
            for &(n, _) in &cells[c].scope.gpus {
                group_of_node[n as usize] = Some(g);
            }
        }
    }
    let len = nodes.len();
    let mut views: Vec<CellNodes> = groups.iter().map(|_| CellNodes::none(len)).collect();
    for (n, node) in nodes.iter_mut().enumerate() {
        if let Some(g) = group_of_node[n] {
            views[g].hold(n, node);
        }
    }
    // The heaviest groups first; a thread that is done takes the next, so a group whose weight
    // misjudges its cost delays no other.
    let mut queue: Vec<(Vec<usize>, CellNodes)> = groups.into_iter().zip(views).collect();
    queue.sort_by_key(|(g, _)| std::cmp::Reverse(weight(g)));
    let queue = Mutex::new(VecDeque::from(queue));
    let next = || queue.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
    let placed: Vec<Vec<(usize, R)>> = std::thread::scope(|s| {
        let running: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = vec![];
                    while let Some((group, mut view)) = next() {
                        for c in group {
                            done.push((c, place(&cells[c], &mut view)));
                        }
                    }
                    done
                })
            })
            .collect();
        running
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    let mut placed: Vec<(usize, R)> = placed.into_iter().flatten().collect();
    placed.sort_by_key(|(c, _)| *c);
    placed.into_iter().map(|(_, r)| r).collect()
}

/// The cells in groups that share no node, each group's cells in cell order; the groups in the
/// order of their first cell.
fn groups(cells: &[Cell], nodes: usize) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..cells.len()).collect();
    let mut first_cell: Vec<Option<usize>> = vec![None; nodes];
    for (c, cell) in cells.iter().enumerate() {
        for &(n, _) in &cell.scope.gpus {
            match first_cell[n as usize] {
                None => first_cell[n as usize] = Some(c),
                Some(other) => {
                    let (a, b) = (root(&mut parent, other), root(&mut parent, c));
                    parent[a.max(b)] = a.min(b);
                }
            }
        }
    }
    let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for c in 0..cells.len() {
        by_root.entry(root(&mut parent, c)).or_default().push(c);
    }
    by_root.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuPartitionPlan, GpuTenant, Mode};
    use crate::planner::allocate::cells::cells;
    use crate::planner::allocate::place::place_and_write;
    use crate::planner::fixtures::*;
    use crate::planner::nodes::build_fleet;
    use crate::policy::{check_plan, check_tenants, models_of_selected_nodes};
    use kube::ResourceExt;

    /// A fleet of three pools (MIG, MPS, exclusive) on nodes of their own: several groups of
    /// cells, more GPUs than [`MIN_GPUS`], tenants asking for all three, some more than there is.
    #[test]
    fn side_by_side_places_as_one_after_the_other() {
        let policies = [policy()];
        let tenants: Vec<GpuTenant> = (0..90)
            .map(|i| {
                TenantBuilder::new(&format!("t{i:02}"), ["internal", "experimental"][i % 2])
                    .priority((i % 3) as i32)
                    .mig("1g.10gb", 20 + i as u32 % 7)
                    .mig("3g.40gb", 3)
                    .want(Mode::Mps, 9)
                    .want(Mode::Exclusive, 1 + i as u32 % 5)
                    .build()
            })
            .collect();
        let plans = [
            plan_for(
                "mig",
                "mig",
                vec![mig_group(
                    "all",
                    &["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"],
                )],
            ),
            plan_for("mps", "mps", vec![group("all", Mode::Mps)]),
            plan_for("exclusive", "exclusive", vec![group("all", Mode::Exclusive)]),
        ];
        let inventory: Vec<_> = (0..600)
            .map(|i| {
                let (pool, model) = [("mig", "H100-80GB"), ("mps", "A100-40GB"), ("exclusive", "H200")][i % 3];
                node(&format!("n{i:03}"), pool, model, 8, true)
            })
            .collect();
        let check = check_tenants(&policies, &tenants, &Default::default());
        assert_eq!(check.valid.len(), tenants.len(), "{:?}", check.invalid);
        let names = tenants.iter().map(|t| t.name_any()).collect();
        let plan_refs: Vec<&GpuPartitionPlan> = plans.iter().collect();
        let checks: Vec<_> = plan_refs
            .iter()
            .map(|p| check_plan(p, &names, &models_of_selected_nodes(p, &inventory)))
            .collect();
        let ran_on = std::sync::Mutex::new(std::collections::BTreeSet::new());
        let placed = |threads: usize| {
            let mut fleet = build_fleet(&inventory, &plan_refs, &checks, None);
            let cells = cells(&check.valid, &fleet.nodes);
            ran_on.lock().unwrap().clear();
            let grants = place_cells(&mut fleet.nodes, &cells, threads, |c, nodes| {
                ran_on
                    .lock()
                    .unwrap()
                    .insert(format!("{:?}", std::thread::current().id()));
                place_and_write(&c.profiles(&check.valid), nodes, &c.scope)
            });
            let specs: Vec<_> = fleet.nodes.iter().map(|n| n.gpus.clone()).collect();
            let on_gpus = groups(&cells, fleet.nodes.len())
                .iter()
                .filter(|g| g.iter().any(|&c| !cells[c].scope.gpus.is_empty()))
                .count();
            (on_gpus, grants, specs)
        };
        let (on_gpus, one_grants, one_specs) = placed(1);
        let one_thread = ran_on.lock().unwrap().clone();
        let (_, two_grants, two_specs) = placed(2);
        let two_threads = ran_on.lock().unwrap().clone();
        assert_eq!(one_thread.len(), 1);
        assert_eq!(two_threads.len(), 2, "the cells ran on {two_threads:?}");
        // Three groups hold GPUs (MIG, MPS, exclusive), and every kind is bound somewhere.
        assert_eq!(on_gpus, 3);
        let gpus = || one_specs.iter().flat_map(|g| g.iter());
        assert!(gpus().any(|g| g.mode == Mode::Mps && !g.shares.is_empty()));
        assert!(gpus().any(|g| g.mode == Mode::Exclusive && !g.tenants.is_empty()));
        assert!(gpus().flat_map(|g| &g.mig_instances).any(|i| i.tenant.is_some()));
        assert_eq!(one_grants, two_grants);
        assert_eq!(one_specs, two_specs);
    }
}
