//! MIG: the per-model placement catalog and the geometry solver.
//!
//! Applying a geometry through NVML lives with the NVML door; this module is pure.

pub mod catalog;
pub mod rule;
pub mod solver;

pub use catalog::{catalog, Catalog, GpuInstanceProfile, GpuModel, Placement};
pub use solver::{solve, ExistingInstance, Geometry, GeometryError, PlacedInstance};
