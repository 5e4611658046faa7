//! MIG geometry: GPU models and profiles, the placement solver and the layout diff. Pure: no NVML.

mod diff;
pub mod dynamic;
mod models;
mod solver;

pub use diff::{ExistingInstance, LayoutDiff, diff_layout, diff_placed};
pub use models::*;
pub use solver::{LayoutError, name_error, resolve_profiles, solve, solve_named, solve_shapes};
