//! Triangle meshes, and the extraction of a signed field's zero level set as one (marching
//! cubes over a voxel lattice).
//!
//! The marching-cubes case table is derived here from first principles on first use, not
//! copied: for each of the 256 sign patterns of a cell's corners, the surface's boundary on
//! each face of the cube is a set of segments that separate the face's negative corners from
//! its positive ones; chained across the six faces they close into loops, and each loop is
//! triangulated without a diagonal lying in a face of the cube. A face with two diagonally
//! opposite negative corners (the ambiguous case) always gets one segment around each negative
//! corner: both cells that share the face see the same signs and make the same choice, so the
//! surface has no cracks between cells.
//!
//! Orientation: a triangle `[a, b, c]` is counter-clockwise seen from the side where the field
//! is positive (for a TSDF, the observed free space in front of the surface), so
//! `(b - a) x (c - a)` points out of the surface, as the vertex normals do.

use std::collections::HashMap;
use std::sync::OnceLock;

/// An indexed triangle mesh. Coordinates are the world frame of whatever produced it (for a
/// reconstruction, OpenCV axes: x right, y down, z forward for an identity camera).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mesh {
    /// Vertex positions.
    pub vertices: Vec<[f32; 3]>,
    /// Unit normals, one per vertex, pointing out of the surface (towards the observed side);
    /// zero for a vertex whose surface is degenerate (no gradient and no area).
    pub normals: Vec<[f32; 3]>,
    /// RGB colours, one per vertex.
    pub colors: Vec<[u8; 3]>,
    /// Triangles as indices into `vertices`, counter-clockwise seen from the outside.
    pub triangles: Vec<[u32; 3]>,
}

impl Mesh {
    /// Whether the mesh has no triangle.
    pub fn is_empty(&self) -> bool {
        self.triangles.is_empty()
    }
}

/// The field at one corner of a cell, as the extraction needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CornerSample {
    /// The signed value: negative behind (inside) the surface, positive or zero in front.
    pub value: f32,
    /// The colour at the corner, interpolated along the edges the surface crosses.
    pub color: [u8; 3],
}

/// Offset of cube corner `c` (bit 0: x, bit 1: y, bit 2: z) from the cell's origin.
fn corner_offset(corner: usize) -> [i64; 3] {
    [0, 1, 2].map(|axis| ((corner >> axis) & 1) as i64)
}

/// The 12 edges of a cube: edge `axis * 4 + j` goes along `axis` from the `j`-th corner (in
/// increasing order) whose `axis` bit is clear.
fn edge_start(edge: usize) -> (usize, usize) {
    let axis = edge / 4;
    let start = (0..8)
        .filter(|c| c & (1 << axis) == 0)
        .nth(edge % 4)
        .expect("4 corners");
    (start, axis)
}

/// The edge joining two corners that differ in one bit.
fn edge_between(a: usize, b: usize) -> usize {
    let differ = a ^ b;
    debug_assert!(differ.is_power_of_two() && differ < 8);
    let axis = differ.trailing_zeros() as usize;
    let start = a.min(b);
    let j = (0..8)
        .filter(|c| c & (1 << axis) == 0)
        .position(|c| c == start)
        .expect("start has the axis bit clear");
    axis * 4 + j
}

/// The six faces of a cube, each as its four corners counter-clockwise seen from outside the
/// cube.
fn faces() -> [[usize; 4]; 6] {
    let mut out = [[0; 4]; 6];
    for axis in 0..3 {
        // (u, v, axis) is a cyclic permutation of (x, y, z), so u x v = +axis.
        let (u, v) = ((axis + 1) % 3, (axis + 2) % 3);
        for side in 0..2 {
            let corner = |du: usize, dv: usize| (side << axis) | (du << u) | (dv << v);
            let ccw_about_plus = [corner(0, 0), corner(1, 0), corner(1, 1), corner(0, 1)];
            out[axis * 2 + side] = if side == 1 {
                ccw_about_plus
            } else {
                // Outward is -axis there: the same loop the other way round.
                let [a, b, c, d] = ccw_about_plus;
                [a, d, c, b]
            };
        }
    }
    out
}

/// The triangles (as edge indices) of one sign pattern; bit `c` of `case` set when corner `c`
/// is negative.
fn case_triangles(case: usize, faces: &[[usize; 4]; 6]) -> Vec<[u8; 3]> {
    let negative = |corner: usize| case & (1 << corner) != 0;
    // next[e]: the edge where the boundary segment that starts on edge e ends.
    let mut next = [usize::MAX; 12];
    for face in faces {
        for k in 0..4 {
            let previous = face[(k + 3) % 4];
            if !negative(face[k]) || negative(previous) {
                continue;
            }
            // A run of negative corners starts at k (counter-clockwise from outside). Its
            // segment goes from the edge entering the run to the edge leaving it, which keeps
            // the positive side on the left seen from outside: the surface then turns
            // counter-clockwise about its outward normal.
            let mut last = k;
            while negative(face[(last + 1) % 4]) {
                last = (last + 1) % 4;
            }
            let entering = edge_between(previous, face[k]);
            let leaving = edge_between(face[last], face[(last + 1) % 4]);
            assert_eq!(next[entering], usize::MAX, "one segment starts per edge");
            next[entering] = leaving;
        }
    }
    let mut triangles = Vec::new();
    let mut visited = [false; 12];
    for first in 0..12 {
        if next[first] == usize::MAX || visited[first] {
            continue;
        }
        let mut ring = Vec::new();
        let mut edge = first;
        while !visited[edge] {
            visited[edge] = true;
            ring.push(edge as u8);
            edge = next[edge];
        }
        // Both hold for every case (each crossed edge ends one segment and starts another;
        // the search always succeeds), and the table is built once, in full, on first use:
        // the tests run it.
        assert_eq!(edge, first, "segments close into loops");
        let found = triangulate(&ring, 0, ring.len() - 1, faces, &mut triangles);
        assert!(
            found,
            "every loop has a triangulation without chords on a face"
        );
    }
    triangles
}

/// Whether two edges of the cube lie on one face.
fn share_a_face(a: u8, b: u8, faces: &[[usize; 4]; 6]) -> bool {
    faces.iter().any(|face| {
        let on_face =
            |edge: u8| (0..4).any(|k| edge_between(face[k], face[(k + 1) % 4]) == edge as usize);
        on_face(a) && on_face(b)
    })
}

/// Triangulates the polygon `ring[i..=j]` (closed by the side from `ring[j]` to `ring[i]`)
/// into `out`, keeping the ring's orientation, without a diagonal between two vertices on one
/// face of the cube. Such a diagonal would lie in the face, which the neighbouring cell shares:
/// on a face the surface crosses twice, both cells could draw the same triangle edge, and the
/// mesh would overlap itself there. (Every loop of every case has such a triangulation, which
/// the tests check; the search over at most 12 vertices is instant.)
fn triangulate(
    ring: &[u8],
    i: usize,
    j: usize,
    faces: &[[usize; 4]; 6],
    out: &mut Vec<[u8; 3]>,
) -> bool {
    if j - i < 2 {
        return true;
    }
    let is_loop_side = i == 0 && j == ring.len() - 1;
    if !is_loop_side && share_a_face(ring[i], ring[j], faces) {
        return false;
    }
    for k in i + 1..j {
        let mark = out.len();
        if triangulate(ring, i, k, faces, out) && triangulate(ring, k, j, faces, out) {
            out.push([ring[i], ring[k], ring[j]]);
            return true;
        }
        out.truncate(mark);
    }
    false
}

/// The 256 cases' triangles, built once.
fn case_table() -> &'static [Vec<[u8; 3]>] {
    static TABLE: OnceLock<Vec<Vec<[u8; 3]>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let faces = faces();
        (0..256).map(|case| case_triangles(case, &faces)).collect()
    })
}

/// The gradient of the trilinear interpolation of `values` (at the cube's corners) at the
/// point `p` of the unit cube.
fn trilinear_gradient(values: &[f32; 8], p: [f64; 3]) -> [f64; 3] {
    let mut gradient = [0.0; 3];
    for (axis, g) in gradient.iter_mut().enumerate() {
        let (u, v) = ((axis + 1) % 3, (axis + 2) % 3);
        for corner in (0..8).filter(|c| c & (1 << axis) == 0) {
            let weight_along = |a: usize| {
                if corner & (1 << a) != 0 {
                    p[a]
                } else {
                    1.0 - p[a]
                }
            };
            let rise = values[corner | (1 << axis)] as f64 - values[corner] as f64;
            *g += rise * weight_along(u) * weight_along(v);
        }
    }
    gradient
}

/// Marching cubes over cells given one at a time, welding the vertices that cells share.
///
/// A vertex is keyed by the lattice edge it lies on (its lower corner and axis), or by the
/// lattice point it is on when the field is exactly zero there, so the cells on either side of
/// an edge, in the same block of a volume or in neighbouring ones, use the same vertex.
pub(crate) struct SurfaceBuilder {
    voxel_size: f64,
    vertices: Vec<[f32; 3]>,
    normal_sums: Vec<[f64; 3]>,
    colors: Vec<[u8; 3]>,
    triangles: Vec<[u32; 3]>,
    vertex_of_edge: HashMap<([i64; 3], u8), u32>,
}

impl SurfaceBuilder {
    /// A builder for a lattice of spacing `voxel_size`: lattice point `i` is at `i * voxel_size`.
    pub(crate) fn new(voxel_size: f64) -> SurfaceBuilder {
        SurfaceBuilder {
            voxel_size,
            vertices: Vec::new(),
            normal_sums: Vec::new(),
            colors: Vec::new(),
            triangles: Vec::new(),
            vertex_of_edge: HashMap::new(),
        }
    }

    /// Adds the surface inside the cell whose lowest corner is lattice point `origin`; corner
    /// `c` of `corners` is at `origin + (c & 1, c >> 1 & 1, c >> 2 & 1)`. Every corner must be
    /// a measured value (the caller skips cells with an unobserved corner).
    pub(crate) fn add_cell(&mut self, origin: [i64; 3], corners: &[CornerSample; 8]) {
        let case = corners
            .iter()
            .enumerate()
            .fold(0, |case, (c, s)| case | (usize::from(s.value < 0.0) << c));
        let triangles = &case_table()[case];
        if triangles.is_empty() {
            return;
        }
        let values = corners.map(|s| s.value);
        for triangle in triangles {
            let [a, b, c] = triangle.map(|edge| self.vertex_on(origin, corners, &values, edge));
            // Two edges meet at a corner whose value is exactly zero: their vertices are that
            // corner's, and the triangle has no area.
            if a != b && b != c && c != a {
                self.triangles.push([a, b, c]);
            }
        }
    }

    /// The vertex where the surface crosses `edge` of the cell at `origin`, made on first use;
    /// the cell's field gradient there is added to its normal.
    fn vertex_on(
        &mut self,
        origin: [i64; 3],
        corners: &[CornerSample; 8],
        values: &[f32; 8],
        edge: u8,
    ) -> u32 {
        let (start, axis) = edge_start(edge as usize);
        let end = start | (1 << axis);
        let (a, b) = (corners[start], corners[end]);
        // One end is negative and the other is not, so the difference is never zero.
        let t = (a.value as f64 / (a.value as f64 - b.value as f64)).clamp(0.0, 1.0);
        let start_offset = corner_offset(start);
        let mut local = start_offset.map(|o| o as f64);
        local[axis] += t;
        // A vertex at a corner (a value of exactly zero) is the same for every edge that meets
        // there: keyed by the corner and a fourth "axis".
        let key = if t == 0.0 {
            (start, 3)
        } else if t == 1.0 {
            (end, 3)
        } else {
            (start, axis as u8)
        };
        let key_offset = corner_offset(key.0);
        let key_corner = [0, 1, 2].map(|i| origin[i] + key_offset[i]);
        let next_index = self.vertices.len() as u32;
        let index = *self
            .vertex_of_edge
            .entry((key_corner, key.1))
            .or_insert(next_index);
        if index == next_index {
            let position =
                [0, 1, 2].map(|i| ((origin[i] as f64 + local[i]) * self.voxel_size) as f32);
            let color = [0, 1, 2].map(|i| {
                let (ca, cb) = (a.color[i] as f64, b.color[i] as f64);
                (ca + (cb - ca) * t).round() as u8
            });
            self.vertices.push(position);
            self.colors.push(color);
            self.normal_sums.push([0.0; 3]);
        }
        let gradient = trilinear_gradient(values, local);
        let sum = &mut self.normal_sums[index as usize];
        for i in 0..3 {
            sum[i] += gradient[i];
        }
        index
    }

    /// The mesh, with each vertex's normal the normalised sum of the field's gradients in the
    /// cells that use it. On an edge, every cell sees the same nonzero rise along it, so the
    /// sum is never zero; at a lattice point where the field is exactly zero between negative
    /// values on opposite sides, the gradients can cancel, and the normal is then that of the
    /// vertex's triangles (area-weighted), or zero if they have no area either.
    pub(crate) fn finish(self) -> Mesh {
        let unit = |n: [f64; 3]| {
            let length = (n[0] * n[0] + n[1] * n[1] + n[2] * n[2]).sqrt();
            (length > 0.0 && length.is_finite()).then(|| n.map(|v| (v / length) as f32))
        };
        let mut normals: Vec<Option<[f32; 3]>> =
            self.normal_sums.iter().map(|&n| unit(n)).collect();
        if normals.iter().any(Option::is_none) {
            let mut face_sums = vec![[0.0f64; 3]; self.vertices.len()];
            for t in &self.triangles {
                let [a, b, c] = t.map(|i| self.vertices[i as usize].map(f64::from));
                let (ab, ac) = (
                    [0, 1, 2].map(|k| b[k] - a[k]),
                    [0, 1, 2].map(|k| c[k] - a[k]),
                );
                let area_normal = [
                    ab[1] * ac[2] - ab[2] * ac[1],
                    ab[2] * ac[0] - ab[0] * ac[2],
                    ab[0] * ac[1] - ab[1] * ac[0],
                ];
                for &i in t {
                    for k in 0..3 {
                        face_sums[i as usize][k] += area_normal[k];
                    }
                }
            }
            for (normal, face_sum) in normals.iter_mut().zip(face_sums) {
                if normal.is_none() {
                    *normal = Some(unit(face_sum).unwrap_or([0.0; 3]));
                }
            }
        }
        Mesh {
            vertices: self.vertices,
            normals: normals.into_iter().flatten().collect(),
            colors: self.colors,
            triangles: self.triangles,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
        [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
    }

    fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
        [
            a[1] * b[2] - a[2] * b[1],
            a[2] * b[0] - a[0] * b[2],
            a[0] * b[1] - a[1] * b[0],
        ]
    }

    fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
        a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
    }

    /// `(b - a) x (c - a)` of a triangle of `mesh`.
    pub(crate) fn face_normal(mesh: &Mesh, triangle: [u32; 3]) -> [f64; 3] {
        let [a, b, c] = triangle.map(|i| mesh.vertices[i as usize].map(f64::from));
        cross(sub(b, a), sub(c, a))
    }

    /// The directed edges of `mesh` that have no opposite edge (boundary edges), after
    /// checking that no directed edge is used twice (that would be a non-manifold edge or two
    /// neighbouring triangles facing opposite ways).
    pub(crate) fn open_edges(mesh: &Mesh) -> Vec<(u32, u32)> {
        let mut directed: HashMap<(u32, u32), usize> = HashMap::new();
        for t in &mesh.triangles {
            for k in 0..3 {
                *directed.entry((t[k], t[(k + 1) % 3])).or_default() += 1;
            }
        }
        assert!(
            directed.values().all(|&n| n == 1),
            "a directed edge is used twice"
        );
        let mut open: Vec<(u32, u32)> = directed
            .keys()
            .filter(|(a, b)| !directed.contains_key(&(*b, *a)))
            .copied()
            .collect();
        open.sort_unstable();
        open
    }

    /// How many edges [`open_edges`] finds.
    pub(crate) fn boundary_edges(mesh: &Mesh) -> usize {
        open_edges(mesh).len()
    }

    /// The volume enclosed by a closed mesh, positive when its triangles face outwards.
    pub(crate) fn signed_volume(mesh: &Mesh) -> f64 {
        mesh.triangles
            .iter()
            .map(|t| {
                let [a, b, c] = t.map(|i| mesh.vertices[i as usize].map(f64::from));
                dot(a, cross(b, c)) / 6.0
            })
            .sum()
    }

    /// Marching cubes over every cell of a `n x n x n` lattice sampled from `field`.
    fn extract(n: i64, voxel_size: f64, field: impl Fn([i64; 3]) -> f32) -> Mesh {
        let mut builder = SurfaceBuilder::new(voxel_size);
        for z in 0..n - 1 {
            for y in 0..n - 1 {
                for x in 0..n - 1 {
                    let corners = std::array::from_fn(|c| {
                        let o = corner_offset(c);
                        let p = [x + o[0], y + o[1], z + o[2]];
                        CornerSample {
                            value: field(p),
                            color: [p[0] as u8, p[1] as u8, p[2] as u8],
                        }
                    });
                    builder.add_cell([x, y, z], &corners);
                }
            }
        }
        builder.finish()
    }

    #[test]
    fn faces_are_counter_clockwise_from_outside_and_edges_are_consistent() {
        for (f, face) in faces().iter().enumerate() {
            let (axis, side) = (f / 2, f % 2);
            let p = face.map(|c| corner_offset(c).map(|v| v as f64));
            let normal = cross(sub(p[1], p[0]), sub(p[2], p[1]));
            let mut outward = [0.0; 3];
            outward[axis] = if side == 1 { 1.0 } else { -1.0 };
            assert!(dot(normal, outward) > 0.0, "face {f}");
        }
        for edge in 0..12 {
            let (start, axis) = edge_start(edge);
            assert_eq!(edge_between(start, start | (1 << axis)), edge);
            assert_eq!(edge_between(start | (1 << axis), start), edge);
        }
    }

    #[test]
    fn the_case_table_has_the_expected_shape() {
        let table = case_table();
        assert!(table[0].is_empty() && table[255].is_empty());
        // One corner cut off, inside or outside: one triangle.
        for corner in 0..8 {
            assert_eq!(table[1 << corner].len(), 1);
            assert_eq!(table[255 ^ (1 << corner)].len(), 1);
        }
        // Half the cube (a face's four corners): a quad.
        assert_eq!(table[0b0000_1111].len(), 2);
        // Every crossed edge is used, and only those.
        for (case, triangles) in table.iter().enumerate() {
            let crossed: Vec<usize> = (0..12)
                .filter(|&e| {
                    let (s, axis) = edge_start(e);
                    (case >> s & 1) != (case >> (s | 1 << axis) & 1)
                })
                .collect();
            let mut used: Vec<usize> = triangles.iter().flatten().map(|&e| e as usize).collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, crossed, "case {case}");
        }
        // No triangle has more than 12 - 2 triangles per loop in total: at most 4 loops of 3.
        assert!(table.iter().all(|t| t.len() <= 10));
    }

    #[test]
    fn one_negative_corner_gives_a_triangle_facing_away_from_it() {
        let mesh = extract(2, 1.0, |p| if p == [0, 0, 0] { -1.0 } else { 1.0 });
        assert_eq!(mesh.triangles.len(), 1);
        let mut vertices = mesh.vertices.clone();
        vertices.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(
            vertices,
            [[0.0, 0.0, 0.5], [0.0, 0.5, 0.0], [0.5, 0.0, 0.0]]
        );
        let n = face_normal(&mesh, mesh.triangles[0]);
        assert!(n.iter().all(|&v| v > 0.0), "{n:?}");
        for normal in &mesh.normals {
            assert!(normal.iter().all(|&v| v > 0.0), "{normal:?}");
        }
    }

    /// Random signs inside a lattice whose border is positive: the surface is closed, every
    /// edge shared by two triangles that face the same way, whatever the cases met (the
    /// ambiguous ones included).
    #[test]
    fn random_fields_give_closed_consistently_oriented_surfaces() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for round in 0..20 {
            let n = 7;
            let values: Vec<f32> = (0..n * n * n)
                .map(|_| (random() * 2.0 - 1.0) as f32)
                .collect();
            let mesh = extract(n, 1.0, |p| {
                if p.iter().any(|&v| v == 0 || v == n - 1) {
                    1.0
                } else {
                    values[(p[0] + n * (p[1] + n * p[2])) as usize]
                }
            });
            assert!(!mesh.is_empty());
            assert_eq!(boundary_edges(&mesh), 0, "round {round}");
            assert!(signed_volume(&mesh) > 0.0, "round {round}");
            // Welded: no two vertices at the same place unless a value is exactly zero.
            let mut positions: Vec<[u32; 3]> =
                mesh.vertices.iter().map(|v| v.map(f32::to_bits)).collect();
            positions.sort_unstable();
            positions.dedup();
            assert_eq!(positions.len(), mesh.vertices.len());
        }
    }

    #[test]
    fn a_sampled_sphere_is_closed_accurate_and_outward_facing() {
        let (n, centre, radius) = (24, [11.3, 12.1, 11.7], 8.4);
        let distance = |p: [f64; 3]| dot(sub(p, centre), sub(p, centre)).sqrt() - radius;
        let mesh = extract(n, 0.5, |p| distance(p.map(|v| v as f64)) as f32);
        assert_eq!(boundary_edges(&mesh), 0);
        let volume = signed_volume(&mesh) / 0.125;
        let exact = 4.0 / 3.0 * std::f64::consts::PI * radius.powi(3);
        assert!((volume / exact - 1.0).abs() < 0.02, "{volume} vs {exact}");
        for (v, normal) in mesh.vertices.iter().zip(&mesh.normals) {
            let p = v.map(|c| c as f64 / 0.5);
            assert!(distance(p).abs() < 0.05, "{p:?}");
            let radial = sub(p, centre).map(|c| c / radius);
            assert!(dot(radial, normal.map(f64::from)) > 0.99);
        }
        for &t in &mesh.triangles {
            let [a, ..] = t.map(|i| mesh.vertices[i as usize].map(|c| c as f64 / 0.5));
            assert!(dot(face_normal(&mesh, t), sub(a, centre)) > 0.0);
        }
    }

    /// A field exactly zero on lattice points (a plane through them): vertices there are
    /// shared by every edge that meets them, and no triangle is degenerate.
    #[test]
    fn zeros_on_the_lattice_give_shared_vertices_and_no_flat_triangles() {
        let mesh = extract(5, 1.0, |p| p[1] as f32 - 2.0);
        assert!(!mesh.is_empty());
        assert!(mesh.vertices.iter().all(|v| v[1] == 2.0));
        assert_eq!(
            mesh.vertices.len(),
            25,
            "one vertex per lattice point of the plane"
        );
        for &t in &mesh.triangles {
            let n = face_normal(&mesh, t);
            assert!(n[1] > 0.0 && n[0] == 0.0 && n[2] == 0.0, "{n:?}");
        }
        // A tilted plane through some lattice points.
        let mesh = extract(6, 1.0, |p| (p[0] + p[1] - p[2]) as f32 - 2.0);
        for &t in &mesh.triangles {
            let n = face_normal(&mesh, t);
            assert!(dot(n, [1.0, 1.0, -1.0]) > 0.0, "{n:?}");
        }
    }

    /// A zero between negative values on both sides along x: the gradients at that lattice
    /// point cancel, and the normal falls back to the triangles' (or zero), never NaN.
    #[test]
    fn cancelling_gradients_give_finite_normals() {
        let mesh = extract(3, 1.0, |p| {
            if p == [1, 1, 1] {
                0.0
            } else if p[1] == 1 && p[2] == 1 {
                -1.0
            } else {
                1.0
            }
        });
        assert!(mesh.normals.iter().flatten().all(|v| v.is_finite()));
        assert_eq!(mesh.normals.len(), mesh.vertices.len());
    }

    #[test]
    fn colours_are_interpolated_along_edges() {
        // The colour's red channel is the x index: a vertex at x = 0.25 gets red 0.25 * 1.
        let mesh = extract(3, 1.0, |p| p[0] as f32 - 1.25);
        assert!(!mesh.is_empty());
        for (v, c) in mesh.vertices.iter().zip(&mesh.colors) {
            assert_eq!(v[0], 1.25);
            assert_eq!(c[0], 1, "round(1.25)");
            assert_eq!([c[1], c[2]], [v[1] as u8, v[2] as u8]);
        }
        // Red from 0 to 200 along x: the crossing a quarter of the way gets 50.
        let mut builder = SurfaceBuilder::new(1.0);
        let corners = std::array::from_fn(|c| CornerSample {
            value: if c & 1 == 0 { -1.0 } else { 3.0 },
            color: if c & 1 == 0 {
                [0, 0, 0]
            } else {
                [200, 100, 40]
            },
        });
        builder.add_cell([0, 0, 0], &corners);
        let mesh = builder.finish();
        assert_eq!(mesh.vertices.len(), 4);
        assert!(mesh.colors.iter().all(|&c| c == [50, 25, 10]));
    }
}
