//! Geometry with no knowledge of the model: similarity transforms, their estimation from
//! corresponding points and their optimisation over a graph, and fusion of depth maps into a
//! volume and a mesh. The streaming reconstruction (`stream`) is built on these.
//!
//! Points, vectors and matrices are plain `f64` arrays (`[f64; 3]`, row-major `[[f64; 3]; 3]`)
//! at the public surface, so callers do not depend on the linear-algebra crate used inside.
//!
//! - [`sim3`]: similarity transforms, composition, exponential and logarithm;
//! - [`align`]: transforms estimated from corresponding points (least squares, and the official
//!   DA3-Streaming robust alignment of two windows' point maps);
//! - [`icp`]: point-to-plane ICP, and normals of organised point maps;
//! - [`pose_graph`]: loop closure, Levenberg–Marquardt over window-to-world transforms;
//! - [`tsdf`]: depth maps fused into a sparse truncated signed distance volume;
//! - [`mesh`]: triangle meshes and their extraction from the volume (marching cubes);
//! - [`points`]: a coloured cloud with a point budget;
//! - [`rotation`]: rotation matrices and quaternions in both component orders.

pub mod align;
mod error;
pub mod icp;
mod kdtree;
pub mod mesh;
pub mod points;
pub mod pose_graph;
pub mod rotation;
pub mod sim3;
mod sparse_cholesky;
pub mod tsdf;

pub use align::{
    align_point_maps, overlap_conf_threshold, robust_sim3, spread_ratio_sim3, weighted_umeyama,
    AlignError, Alignment, RobustOptions,
};
pub use icp::{grid_normals, point_to_plane_icp, IcpOptions, IcpResult};
pub use mesh::Mesh;
pub use points::PointAccumulator;
pub use pose_graph::{Edge, LmOptions, OptimizeReport, PoseGraph};
pub use sim3::{chain, relative_through_common, Sim3};
pub use tsdf::{DepthFrame, FusionError, IntegrationStats, TsdfOptions, TsdfVolume};
