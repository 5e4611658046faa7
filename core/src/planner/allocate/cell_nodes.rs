//! The nodes a cell's passes read and bind, by their position in the fleet: the fleet's, or one
//! group's of the cells placed side by side (`side_by_side`). Below every pass, so that they
//! index nodes the same way whoever holds the rest.

use crate::planner::nodes::NodeDesired;
use std::ops::{Index, IndexMut};

/// The nodes a cell's passes read and bind, by their position in the fleet: every node, or only
/// those of one group of cells placed side by side (the other groups hold the others).
pub(super) struct CellNodes<'v, 'a> {
    nodes: Vec<Option<&'v mut NodeDesired<'a>>>,
}

impl<'v, 'a> CellNodes<'v, 'a> {
    /// Every node of the fleet.
    pub fn fleet(nodes: &'v mut [NodeDesired<'a>]) -> Self {
        CellNodes {
            nodes: nodes.iter_mut().map(Some).collect(),
        }
    }

    /// None of a fleet of `len` nodes yet.
    pub fn none(len: usize) -> Self {
        CellNodes {
            nodes: (0..len).map(|_| None).collect(),
        }
    }

    /// Adds the node at position `n`.
    pub fn hold(&mut self, n: usize, node: &'v mut NodeDesired<'a>) {
        self.nodes[n] = Some(node);
    }
}

impl<'a> Index<usize> for CellNodes<'_, 'a> {
    type Output = NodeDesired<'a>;

    fn index(&self, n: usize) -> &NodeDesired<'a> {
        // A cell reads only the nodes of its scope, and its view holds all of them.
        self.nodes[n].as_deref().expect("a cell reads only its own nodes")
    }
}

impl IndexMut<usize> for CellNodes<'_, '_> {
    fn index_mut(&mut self, n: usize) -> &mut Self::Output {
        self.nodes[n]
            .as_deref_mut()
            .expect("a cell binds only on its own nodes")
    }
}
