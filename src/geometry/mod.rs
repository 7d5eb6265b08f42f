//! Geometry with no knowledge of the model: similarity transforms, their estimation from
//! corresponding points and their optimisation over a graph, and fusion of depth maps into a
//! volume and a mesh. The streaming reconstruction (`stream`) is built on these.
//!
//! Points, vectors and matrices are plain `f64` arrays (`[f64; 3]`, row-major `[[f64; 3]; 3]`)
//! at the public surface, so callers do not depend on the linear-algebra crate used inside.

pub mod mesh;
pub mod points;
pub mod tsdf;

pub use mesh::Mesh;
pub use points::PointAccumulator;
pub use tsdf::{DepthFrame, FusionError, IntegrationStats, TsdfOptions, TsdfVolume};
