//! Fusion of depth maps ray-cast from analytic scenes (a sphere, a box on a plane) by cameras
//! of known pose: the mesh must lie on the true surface, cover what the cameras saw, face
//! them, and carry the scene's colours.

use super::*;
use crate::geometry::mesh::tests::{boundary_edges, face_normal, open_edges, signed_volume};

type Vec3 = [f64; 3];

fn add(a: Vec3, b: Vec3) -> Vec3 {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

fn sub(a: Vec3, b: Vec3) -> Vec3 {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

fn times(a: Vec3, k: f64) -> Vec3 {
    a.map(|v| v * k)
}

fn dot(a: Vec3, b: Vec3) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn cross(a: Vec3, b: Vec3) -> Vec3 {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn norm(a: Vec3) -> f64 {
    dot(a, a).sqrt()
}

fn unit(a: Vec3) -> Vec3 {
    times(a, 1.0 / norm(a))
}

/// Surfaces that rays can hit and points can measure their distance to.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Sphere {
        centre: Vec3,
        radius: f64,
    },
    /// A sphere seen from inside (its normals point to its centre).
    Room {
        centre: Vec3,
        radius: f64,
    },
    /// A box: its centre, half extents along its own axes, and those axes (unit, orthogonal).
    Cuboid {
        centre: Vec3,
        half: Vec3,
        axes: [Vec3; 3],
    },
    /// A rectangle: its centre, two orthogonal unit axes in its plane (its normal is their
    /// cross product), and its half sizes along them.
    Rectangle {
        centre: Vec3,
        axes: [Vec3; 2],
        half: [f64; 2],
    },
}

impl Shape {
    /// The smallest positive `t` at which `origin + t * direction` is on the surface.
    fn hit(&self, origin: Vec3, direction: Vec3) -> Option<f64> {
        match *self {
            Shape::Sphere { centre, radius } | Shape::Room { centre, radius } => {
                let o = sub(origin, centre);
                let (a, b, c) = (
                    dot(direction, direction),
                    2.0 * dot(direction, o),
                    dot(o, o) - radius * radius,
                );
                let disc = b * b - 4.0 * a * c;
                if disc < 0.0 {
                    return None;
                }
                let near = (-b - disc.sqrt()) / (2.0 * a);
                let far = (-b + disc.sqrt()) / (2.0 * a);
                [near, far].into_iter().find(|&t| t > 0.0)
            }
            Shape::Cuboid { centre, half, axes } => {
                let o = axes.map(|a| dot(a, sub(origin, centre)));
                let d = axes.map(|a| dot(a, direction));
                let (mut enter, mut exit) = (f64::NEG_INFINITY, f64::INFINITY);
                for i in 0..3 {
                    if d[i] == 0.0 {
                        if o[i].abs() > half[i] {
                            return None;
                        }
                        continue;
                    }
                    let (t1, t2) = ((-half[i] - o[i]) / d[i], (half[i] - o[i]) / d[i]);
                    enter = enter.max(t1.min(t2));
                    exit = exit.min(t1.max(t2));
                }
                if exit < enter.max(0.0) {
                    return None;
                }
                Some(if enter > 0.0 { enter } else { exit })
            }
            Shape::Rectangle { centre, axes, half } => {
                let normal = cross(axes[0], axes[1]);
                let along = dot(normal, direction);
                if along.abs() < 1e-12 {
                    return None;
                }
                let t = dot(normal, sub(centre, origin)) / along;
                let p = sub(add(origin, times(direction, t)), centre);
                (t > 0.0 && (0..2).all(|i| dot(axes[i], p).abs() <= half[i])).then_some(t)
            }
        }
    }

    /// The distance from `p` to the surface.
    fn distance(&self, p: Vec3) -> f64 {
        match *self {
            Shape::Sphere { centre, radius } | Shape::Room { centre, radius } => {
                (norm(sub(p, centre)) - radius).abs()
            }
            Shape::Cuboid { centre, half, axes } => {
                let q = [0, 1, 2].map(|i| dot(axes[i], sub(p, centre)).abs() - half[i]);
                let outside = norm(q.map(|v| v.max(0.0)));
                let inside = q[0].max(q[1]).max(q[2]).min(0.0);
                (outside + inside).abs()
            }
            Shape::Rectangle { centre, axes, half } => {
                let d = sub(p, centre);
                let normal = cross(axes[0], axes[1]);
                let outside = [0, 1].map(|i| (dot(axes[i], d).abs() - half[i]).max(0.0));
                (dot(normal, d).powi(2) + outside[0].powi(2) + outside[1].powi(2)).sqrt()
            }
        }
    }

    /// About `n` points spread over the surface, with their outward normals.
    fn samples(&self, n: usize) -> Vec<(Vec3, Vec3)> {
        match *self {
            Shape::Sphere { centre, radius } => (0..n)
                .map(|i| {
                    // A Fibonacci spiral: evenly spread directions.
                    let z = 1.0 - (2.0 * i as f64 + 1.0) / n as f64;
                    let angle = i as f64 * std::f64::consts::PI * (3.0 - 5f64.sqrt());
                    let r = (1.0 - z * z).sqrt();
                    let normal = [r * angle.cos(), r * angle.sin(), z];
                    (add(centre, times(normal, radius)), normal)
                })
                .collect(),
            Shape::Room { centre, radius } => Shape::Sphere { centre, radius }
                .samples(n)
                .into_iter()
                .map(|(p, normal)| (p, times(normal, -1.0)))
                .collect(),
            Shape::Cuboid { centre, half, axes } => {
                let per_face = (n / 6).max(1);
                let side = (per_face as f64).sqrt().ceil() as usize;
                let mut out = Vec::new();
                for axis in 0..3 {
                    let (u, v) = ((axis + 1) % 3, (axis + 2) % 3);
                    for sign in [-1.0, 1.0] {
                        let normal = times(axes[axis], sign);
                        for i in 0..side {
                            for j in 0..side {
                                let a = (2.0 * (i as f64 + 0.5) / side as f64 - 1.0) * half[u];
                                let b = (2.0 * (j as f64 + 0.5) / side as f64 - 1.0) * half[v];
                                let p = add(
                                    add(centre, times(normal, half[axis])),
                                    add(times(axes[u], a), times(axes[v], b)),
                                );
                                out.push((p, normal));
                            }
                        }
                    }
                }
                out
            }
            Shape::Rectangle { centre, axes, half } => {
                let side = (n as f64).sqrt().ceil() as usize;
                let normal = cross(axes[0], axes[1]);
                let mut out = Vec::new();
                for i in 0..side {
                    for j in 0..side {
                        let a = (2.0 * (i as f64 + 0.5) / side as f64 - 1.0) * half[0];
                        let b = (2.0 * (j as f64 + 0.5) / side as f64 - 1.0) * half[1];
                        let p = add(centre, add(times(axes[0], a), times(axes[1], b)));
                        out.push((p, normal));
                    }
                }
                out
            }
        }
    }
}

/// The nearest hit of a ray among `shapes`.
fn cast(shapes: &[Shape], origin: Vec3, direction: Vec3) -> Option<f64> {
    shapes
        .iter()
        .filter_map(|s| s.hit(origin, direction))
        .min_by(f64::total_cmp)
}

fn distance_to_scene(shapes: &[Shape], p: Vec3) -> f64 {
    shapes
        .iter()
        .map(|s| s.distance(p))
        .fold(f64::INFINITY, f64::min)
}

/// The scene's colour: a smooth function of position, so that interpolated colours can be
/// checked against it.
fn colour_of(p: Vec3) -> [u8; 3] {
    [0, 1, 2].map(|i| (128.0 + 25.0 * p[i]).round().clamp(0.0, 255.0) as u8)
}

const WIDTH: usize = 160;
const HEIGHT: usize = 120;
const INTRINSICS: [[f64; 3]; 3] = [[140.0, 0.0, 79.5], [0.0, 140.0, 59.5], [0.0, 0.0, 1.0]];

/// A camera at `eye` looking at `target` (OpenCV axes: x right, y down, z forward), whose
/// depth is in units `scale` times smaller than the world's.
fn look_at(eye: Vec3, target: Vec3, scale: f64) -> Sim3 {
    let forward = unit(sub(target, eye));
    let helper = if forward[1].abs() < 0.9 {
        [0.0, 1.0, 0.0]
    } else {
        [1.0, 0.0, 0.0]
    };
    // (right, down, forward) right-handed, "down" as close to +y as the view allows.
    let right = unit(cross(helper, forward));
    let down = cross(forward, right);
    Sim3 {
        scale,
        rotation: [0, 1, 2].map(|i| [right[i], down[i], forward[i]]),
        translation: eye,
    }
}

/// The depth map (camera units) and colours `pose` sees of `shapes`.
fn render(pose: &Sim3, shapes: &[Shape]) -> (Vec<f32>, Vec<[u8; 3]>) {
    let k = INTRINSICS;
    let mut depth = vec![0.0; WIDTH * HEIGHT];
    let mut colors = vec![[0; 3]; WIDTH * HEIGHT];
    for v in 0..HEIGHT {
        for u in 0..WIDTH {
            let ray = [
                (u as f64 - k[0][2]) / k[0][0],
                (v as f64 - k[1][2]) / k[1][1],
                1.0,
            ];
            // The world ray s R ray: camera point t * ray is world point eye + t * direction.
            let direction = sub(pose.apply(ray), pose.translation);
            if let Some(t) = cast(shapes, pose.translation, direction) {
                depth[v * WIDTH + u] = t as f32;
                colors[v * WIDTH + u] = colour_of(add(pose.translation, times(direction, t)));
            }
        }
    }
    (depth, colors)
}

fn frame<'a>(pose: &Sim3, depth: &'a [f32], colors: &'a [[u8; 3]]) -> DepthFrame<'a> {
    DepthFrame {
        width: WIDTH,
        height: HEIGHT,
        depth,
        weights: None,
        colors: Some(colors),
        intrinsics: INTRINSICS,
        camera_to_world: *pose,
    }
}

/// Integrates what every pose sees of `shapes`.
fn fuse(options: TsdfOptions, poses: &[Sim3], shapes: &[Shape]) -> TsdfVolume {
    let mut volume = TsdfVolume::new(options).unwrap();
    for pose in poses {
        let (depth, colors) = render(pose, shapes);
        let stats = volume.integrate(&frame(pose, &depth, &colors)).unwrap();
        assert!(stats.pixels_used > 0 && stats.blocks_dropped == 0);
    }
    volume
}

/// Whether some camera sees surface point `p` (normal `normal`) unoccluded, inside its image,
/// at most 70 degrees from the normal.
fn seen(p: Vec3, normal: Vec3, poses: &[Sim3], shapes: &[Shape]) -> bool {
    let k = INTRINSICS;
    poses.iter().any(|pose| {
        let to_camera = sub(pose.translation, p);
        let camera = pose.inverse().apply(p);
        let (u, v) = (
            k[0][0] * camera[0] / camera[2] + k[0][2],
            k[1][1] * camera[1] / camera[2] + k[1][2],
        );
        let inside = camera[2] > 0.0
            && (0.0..WIDTH as f64 - 1.0).contains(&u)
            && (0.0..HEIGHT as f64 - 1.0).contains(&v);
        let facing = dot(unit(to_camera), normal) > 20f64.to_radians().sin();
        let unoccluded =
            cast(shapes, pose.translation, times(to_camera, -1.0)).is_some_and(|t| t > 1.0 - 1e-6);
        inside && facing && unoccluded
    })
}

/// Distances from points to their nearest mesh vertex (searched within `radius`).
struct VertexGrid {
    cell: f64,
    cells: HashMap<[i64; 3], Vec<Vec3>>,
}

impl VertexGrid {
    fn new(mesh: &Mesh, radius: f64) -> VertexGrid {
        let mut cells: HashMap<[i64; 3], Vec<Vec3>> = HashMap::new();
        for v in &mesh.vertices {
            let p = v.map(f64::from);
            cells
                .entry(p.map(|c| (c / radius).floor() as i64))
                .or_default()
                .push(p);
        }
        VertexGrid {
            cell: radius,
            cells,
        }
    }

    /// The distance to the nearest vertex, if one is within the radius.
    fn nearest(&self, p: Vec3) -> Option<f64> {
        let key = p.map(|c| (c / self.cell).floor() as i64);
        let mut best = f64::INFINITY;
        for dz in -1..=1 {
            for dy in -1..=1 {
                for dx in -1..=1 {
                    let neighbour = [key[0] + dx, key[1] + dy, key[2] + dz];
                    for v in self.cells.get(&neighbour).into_iter().flatten() {
                        best = best.min(norm(sub(*v, p)));
                    }
                }
            }
        }
        (best <= self.cell).then_some(best)
    }
}

/// What a mesh of a scene measures up to, in voxels where a distance.
#[derive(Debug)]
struct Quality {
    /// The largest distance from a vertex to the true surface.
    max_vertex_distance: f64,
    /// The share of seen surface samples with a vertex within 1.5 voxels.
    coverage: f64,
    samples_seen: usize,
    /// Mean and largest difference between a vertex's colour and the scene's colour there.
    mean_colour_error: f64,
    max_colour_error: u8,
}

fn quality(mesh: &Mesh, voxel: f64, poses: &[Sim3], shapes: &[Shape]) -> Quality {
    let max_vertex_distance = mesh
        .vertices
        .iter()
        .map(|v| distance_to_scene(shapes, v.map(f64::from)) / voxel)
        .fold(0.0, f64::max);
    let grid = VertexGrid::new(mesh, 1.5 * voxel);
    let seen_samples: Vec<Vec3> = shapes
        .iter()
        .flat_map(|s| s.samples(4000))
        .filter(|&(p, n)| seen(p, n, poses, shapes))
        .map(|(p, _)| p)
        .collect();
    let covered = seen_samples
        .iter()
        .filter(|&&p| grid.nearest(p).is_some())
        .count();
    let errors: Vec<u8> = mesh
        .vertices
        .iter()
        .zip(&mesh.colors)
        .flat_map(|(v, c)| {
            let truth = colour_of(v.map(f64::from));
            [0, 1, 2].map(|i| truth[i].abs_diff(c[i]))
        })
        .collect();
    Quality {
        max_vertex_distance,
        coverage: covered as f64 / seen_samples.len() as f64,
        samples_seen: seen_samples.len(),
        mean_colour_error: errors.iter().map(|&e| e as f64).sum::<f64>() / errors.len() as f64,
        max_colour_error: errors.iter().copied().max().unwrap_or(0),
    }
}

const SPHERE: Shape = Shape::Sphere {
    centre: [0.13, -0.21, 0.07],
    radius: 1.0,
};

/// A spherical room around the sphere and its cameras: the background that rays passing the
/// sphere hit, so that the free space around the sphere is observed. (Pixels without depth
/// observe nothing: a sphere against an empty background has holes where only the rays
/// passing just beside it, which measure nothing, could have seen the free space.)
const ROOM: Shape = Shape::Room {
    centre: [0.13, -0.21, 0.07],
    radius: 4.0,
};

/// Eight cameras 3 units from the sphere's centre, all around it; one (from -z) has depth in
/// units 2.5 times smaller than the world's, one (from +z) 0.8 times.
fn cameras_around_the_sphere() -> Vec<Sim3> {
    let Shape::Sphere { centre, .. } = SPHERE else {
        unreachable!()
    };
    let directions: [(Vec3, f64); 8] = [
        ([1.0, 0.0, 0.0], 1.0),
        ([-1.0, 0.0, 0.0], 1.0),
        ([0.0, 1.0, 0.0], 1.0),
        ([0.0, -1.0, 0.0], 1.0),
        ([0.0, 0.0, 1.0], 0.8),
        ([0.0, 0.0, -1.0], 2.5),
        ([1.0, 1.0, 1.0], 1.0),
        ([-1.0, -1.0, 1.0], 1.0),
    ];
    directions
        .iter()
        .map(|&(d, scale)| look_at(add(centre, times(unit(d), 3.0)), centre, scale))
        .collect()
}

#[test]
fn a_sphere_seen_from_all_around_is_meshed_closed_on_its_surface() {
    let voxel = 0.03;
    let poses = cameras_around_the_sphere();
    let shapes = [SPHERE, ROOM];
    let volume = fuse(TsdfOptions::new(voxel), &poses, &shapes);
    let mesh = volume.extract_mesh();
    let q = quality(&mesh, voxel, &poses, &shapes);
    eprintln!(
        "sphere in a room: {} vertices, {} triangles, {} blocks, {q:?}",
        mesh.vertices.len(),
        mesh.triangles.len(),
        volume.allocated_blocks()
    );
    assert!(q.max_vertex_distance < 1.0, "{q:?}");
    assert!(q.samples_seen > 6000 && q.coverage == 1.0, "{q:?}");
    assert!(
        q.mean_colour_error < 1.5 && q.max_colour_error <= 8,
        "{q:?}"
    );

    // The sphere's part of the mesh: closed (every edge shared by two triangles facing the
    // same way), of the right volume, facing outwards.
    let Shape::Sphere { centre, radius } = SPHERE else {
        unreachable!()
    };
    let on_sphere = |i: u32| norm(sub(mesh.vertices[i as usize].map(f64::from), centre)) < 2.0;
    let sphere = Mesh {
        triangles: mesh
            .triangles
            .iter()
            .copied()
            .filter(|t| t.iter().all(|&i| on_sphere(i)))
            .collect(),
        ..mesh.clone()
    };
    let open: Vec<Vec3> = open_edges(&sphere)
        .iter()
        .map(|&(a, _)| unit(sub(sphere.vertices[a as usize].map(f64::from), centre)))
        .collect();
    assert!(
        open.is_empty(),
        "{} open edges, at {:?}",
        open.len(),
        &open[..open.len().min(4)]
    );
    let volume_ratio = signed_volume(&sphere) / (4.0 / 3.0 * std::f64::consts::PI * radius.powi(3));
    assert!((volume_ratio - 1.0).abs() < 0.02, "{volume_ratio}");
    for &t in &sphere.triangles {
        let a = mesh.vertices[t[0] as usize].map(f64::from);
        assert!(dot(face_normal(&mesh, t), sub(a, centre)) > 0.0);
    }
    // The room faces inwards, towards its cameras (but for a few tiny triangles at the edges
    // of what the cameras saw of it).
    let (mut inwards, mut total) = (0.0, 0.0);
    for &t in mesh.triangles.iter().filter(|t| !on_sphere(t[0])) {
        let a = mesh.vertices[t[0] as usize].map(f64::from);
        let normal = face_normal(&mesh, t);
        total += norm(normal);
        if dot(normal, sub(a, centre)) < 0.0 {
            inwards += norm(normal);
        }
    }
    assert!(inwards / total > 0.9995, "{}", inwards / total);
    let mut worst_normal: f64 = 1.0;
    for (i, (v, n)) in mesh.vertices.iter().zip(&mesh.normals).enumerate() {
        let radial = unit(sub(v.map(f64::from), centre));
        if on_sphere(i as u32) {
            worst_normal = worst_normal.min(dot(radial, n.map(f64::from)));
        } else {
            assert!(dot(radial, n.map(f64::from)) < 0.0, "{n:?} at {v:?}");
        }
    }
    // The normals follow the sphere within about 30 degrees (ripples of a fraction of a voxel
    // where views of different angles meet).
    eprintln!("sphere normals: smallest cosine to the true normal {worst_normal:.3}");
    assert!(worst_normal > 0.8, "{worst_normal}");
}

/// A box standing on a ground rectangle, turned 30 degrees, seen from a ring of cameras above
/// and one overhead: sharp edges, a concave corner where they meet, occlusion.
#[test]
fn a_box_on_a_plane_is_meshed_on_its_surface_and_faces_the_cameras() {
    let voxel = 0.02;
    let angle = 30f64.to_radians();
    let (c, s) = (angle.cos(), angle.sin());
    // World "up" is -y (OpenCV's y points down).
    let cuboid = Shape::Cuboid {
        centre: [0.05, -0.3, 0.02],
        half: [0.45, 0.3, 0.35],
        axes: [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]],
    };
    let ground = Shape::Rectangle {
        centre: [0.0, 0.0, 0.0],
        // x cross z = -y: the normal points up.
        axes: [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]],
        half: [1.2, 1.2],
    };
    let shapes = [cuboid, ground];
    let mut poses: Vec<Sim3> = (0..8)
        .map(|i| {
            let a = i as f64 * std::f64::consts::TAU / 8.0;
            let eye = [2.4 * a.cos(), -1.9, 2.4 * a.sin()];
            look_at(eye, [0.0, -0.2, 0.0], if i == 3 { 1.7 } else { 1.0 })
        })
        .collect();
    poses.push(look_at([0.1, -3.2, 0.05], [0.0, 0.0, 0.0], 1.0));
    let volume = fuse(TsdfOptions::new(voxel), &poses, &shapes);
    let mesh = volume.extract_mesh();
    let q = quality(&mesh, voxel, &poses, &shapes);
    eprintln!(
        "box on a plane: {} vertices, {} triangles, {} blocks, {q:?}",
        mesh.vertices.len(),
        mesh.triangles.len(),
        volume.allocated_blocks()
    );
    assert!(q.max_vertex_distance < 1.0, "{q:?}");
    assert!(q.samples_seen > 4000 && q.coverage > 0.99, "{q:?}");
    assert!(q.mean_colour_error < 1.5, "{q:?}");
    // Triangles face the observed side: their winding agrees with the field's gradient (the
    // vertex normals), and nearly all of their area faces a camera (ripples a fraction of a
    // voxel high on the box's sides tilt a few tiny triangles away from every camera).
    let (mut facing, mut total) = (0.0, 0.0);
    for &t in &mesh.triangles {
        let a = mesh.vertices[t[0] as usize].map(f64::from);
        let normal = face_normal(&mesh, t);
        let gradient = t.iter().fold([0.0; 3], |s, &i| {
            add(s, mesh.normals[i as usize].map(f64::from))
        });
        // (Slivers of no area, with three vertices on one lattice line where the field is
        // exactly zero, have no winding to check.)
        assert!(dot(normal, gradient) > 0.0 || norm(normal) < 1e-6 * voxel * voxel);
        total += norm(normal);
        if poses
            .iter()
            .any(|p| dot(normal, sub(p.translation, a)) > 0.0)
        {
            facing += norm(normal);
        }
    }
    assert!(facing / total > 0.9995, "{}", facing / total);
    for (v, n) in mesh.vertices.iter().zip(&mesh.normals) {
        let p = v.map(f64::from);
        assert!(poses
            .iter()
            .any(|c| dot(n.map(f64::from), sub(c.translation, p)) > 0.0));
    }
    // The ground's vertices away from the box (and from the concave corner at its foot, which
    // the truncation band rounds) and from the ground's border face up.
    let up = [0.0, -1.0, 0.0];
    for (v, n) in mesh.vertices.iter().zip(&mesh.normals) {
        let p = v.map(f64::from);
        let inside_the_border = p[0].abs().max(p[2].abs()) < 1.2 - 4.0 * voxel;
        if p[1].abs() < voxel && cuboid.distance(p) > 8.0 * voxel && inside_the_border {
            assert!(dot(n.map(f64::from), up) > 0.9, "{n:?} at {p:?}");
        }
    }
}

/// The volume's blocks and voxels, in coordinate order.
fn contents(volume: &TsdfVolume) -> Vec<([i32; 3], Vec<Voxel>)> {
    let mut out: Vec<([i32; 3], Vec<Voxel>)> = volume
        .index
        .iter()
        .map(|(k, &p)| (*k, volume.blocks[p as usize].to_vec()))
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

#[test]
fn a_pixel_of_weight_zero_is_no_measurement() {
    let pose = cameras_around_the_sphere()[6];
    let (depth, colors) = render(&pose, &[SPHERE]);
    // Every third pixel gets weight 0 (and a wrong depth, which must not matter); the others
    // various weights.
    let weights: Vec<f32> = (0..depth.len())
        .map(|i| {
            if i % 3 == 0 {
                0.0
            } else {
                0.25 + (i % 7) as f32
            }
        })
        .collect();
    let mut bent = depth.clone();
    let mut removed = depth.clone();
    for i in (0..depth.len()).step_by(3) {
        bent[i] = 0.5 * depth[i] + 0.1;
        removed[i] = 0.0;
    }
    let integrate = |depth: &[f32]| {
        let mut volume = TsdfVolume::new(TsdfOptions::new(0.03)).unwrap();
        let stats = volume
            .integrate(&DepthFrame {
                weights: Some(&weights),
                ..frame(&pose, depth, &colors)
            })
            .unwrap();
        (stats, volume)
    };
    let (stats_bent, with_weights) = integrate(&bent);
    let (stats_removed, without) = integrate(&removed);
    assert_eq!(stats_bent, stats_removed);
    assert_eq!(contents(&with_weights), contents(&without));
    assert!(!with_weights.extract_mesh().is_empty());

    // A frame weighing nothing changes nothing.
    let mut volume = with_weights.clone();
    let nothing = vec![0.0; depth.len()];
    let stats = volume
        .integrate(&DepthFrame {
            weights: Some(&nothing),
            ..frame(&pose, &depth, &colors)
        })
        .unwrap();
    assert_eq!(stats, IntegrationStats::default());
    assert_eq!(contents(&volume), contents(&with_weights));
    // Nor do NaN, infinite or negative weights, or NaN and negative depths.
    let odd_weights: Vec<f32> = (0..depth.len())
        .map(|i| [f32::NAN, f32::INFINITY, -1.0, f32::NEG_INFINITY][i % 4])
        .collect();
    let odd_depths: Vec<f32> = (0..depth.len())
        .map(|i| [f32::NAN, f32::INFINITY, -1.0, 0.0][i % 4])
        .collect();
    volume
        .integrate(&DepthFrame {
            weights: Some(&odd_weights),
            ..frame(&pose, &depth, &colors)
        })
        .unwrap();
    volume
        .integrate(&frame(&pose, &odd_depths, &colors))
        .unwrap();
    assert_eq!(contents(&volume), contents(&with_weights));
}

/// Frames without colours leave the colours as they are: mid-grey where no coloured frame
/// has been; a coloured frame then gives its colours whole.
#[test]
fn frames_without_colours_leave_colours_alone() {
    let pose = cameras_around_the_sphere()[0];
    let (depth, colors) = render(&pose, &[SPHERE]);
    let mut volume = TsdfVolume::new(TsdfOptions::new(0.03)).unwrap();
    let grey = DepthFrame {
        colors: None,
        ..frame(&pose, &depth, &colors)
    };
    volume.integrate(&grey).unwrap();
    let mesh = volume.extract_mesh();
    assert!(!mesh.is_empty() && mesh.colors.iter().all(|&c| c == [128; 3]));
    volume.integrate(&frame(&pose, &depth, &colors)).unwrap();
    let q = quality(&volume.extract_mesh(), 0.03, &[pose], &[SPHERE]);
    assert!(q.mean_colour_error < 1.5, "{q:?}");
}

/// A camera whose depth is in units twice the world's, and the same camera with depth in the
/// world's units, fuse the same volume.
#[test]
fn the_camera_scale_converts_depth_to_world_units() {
    let pose = cameras_around_the_sphere()[0];
    let (depth, colors) = render(&pose, &[SPHERE]);
    let halved: Vec<f32> = depth.iter().map(|d| d / 2.0).collect();
    let scaled = Sim3 { scale: 2.0, ..pose };
    let mut a = TsdfVolume::new(TsdfOptions::new(0.03)).unwrap();
    let mut b = a.clone();
    a.integrate(&frame(&pose, &depth, &colors)).unwrap();
    b.integrate(&frame(&scaled, &halved, &colors)).unwrap();
    let (a, b) = (contents(&a), contents(&b));
    assert_eq!(a.len(), b.len());
    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
        assert_eq!(ka, kb);
        for (x, y) in va.iter().zip(vb) {
            assert_eq!(x.weight, y.weight);
            assert!((x.tsdf - y.tsdf).abs() < 1e-5);
        }
    }
}

#[test]
fn the_block_budget_holds_and_drops_are_counted() {
    let poses = cameras_around_the_sphere();
    let options = TsdfOptions {
        max_blocks: 40,
        ..TsdfOptions::new(0.03)
    };
    let bound = options.memory_bound_bytes();
    let mut volume = TsdfVolume::new(options).unwrap();
    let (mut allocated, mut dropped) = (0, 0);
    for pose in &poses {
        let (depth, colors) = render(pose, &[SPHERE]);
        let stats = volume.integrate(&frame(pose, &depth, &colors)).unwrap();
        allocated += stats.blocks_allocated;
        dropped += stats.blocks_dropped;
        assert!(volume.allocated_blocks() <= 40);
        assert!(
            volume.memory_bytes() <= bound,
            "{} > {bound}",
            volume.memory_bytes()
        );
    }
    assert_eq!((allocated, dropped), (40, volume.dropped_blocks()));
    assert!(dropped > 100, "{dropped}");
    // What was kept still meshes.
    assert!(!volume.extract_mesh().is_empty());

    // The default budget's bound, as documented.
    let default = TsdfOptions::new(1.0).memory_bound_bytes();
    assert!((200_000_000..204_000_000).contains(&default), "{default}");
    // A full volume's memory is near its bound.
    let full = fuse(TsdfOptions::new(0.03), &poses, &[SPHERE]);
    let per_block = full.memory_bytes() as f64 / full.allocated_blocks() as f64;
    assert!((6144.0..6400.0).contains(&per_block), "{per_block}");
}

#[test]
fn an_empty_volume_has_an_empty_mesh() {
    let volume = TsdfVolume::new(TsdfOptions::for_scene(2.0, 100)).unwrap();
    assert_eq!(volume.options().voxel_size, 2.0 / 128.0);
    assert_eq!(volume.options().truncation, 4.0 * 2.0 / 128.0);
    assert_eq!(volume.extract_mesh(), Mesh::default());
    assert_eq!((volume.allocated_blocks(), volume.dropped_blocks()), (0, 0));
    // A frame that sees nothing leaves it empty.
    let mut volume = volume;
    let depth = vec![0.0; WIDTH * HEIGHT];
    let colors = vec![[0; 3]; WIDTH * HEIGHT];
    let stats = volume
        .integrate(&frame(&Sim3::IDENTITY, &depth, &colors))
        .unwrap();
    assert_eq!(stats, IntegrationStats::default());
    assert_eq!(volume.extract_mesh(), Mesh::default());
}

#[test]
fn bad_options_and_frames_are_errors() {
    for options in [
        TsdfOptions::new(0.0),
        TsdfOptions::new(-1.0),
        TsdfOptions::new(f64::NAN),
        TsdfOptions::new(f64::INFINITY),
        TsdfOptions::for_scene(0.0, 10),
        TsdfOptions::for_scene(1.0, 0),
        TsdfOptions::for_scene(1.0, MAX_BLOCKS_LIMIT + 1),
        TsdfOptions {
            truncation: 0.5,
            ..TsdfOptions::new(1.0)
        },
        TsdfOptions {
            truncation: f64::NAN,
            ..TsdfOptions::new(1.0)
        },
    ] {
        let err = TsdfVolume::new(options.clone()).unwrap_err();
        assert!(matches!(err, FusionError::Options(_)), "{options:?}: {err}");
    }

    let mut volume = TsdfVolume::new(TsdfOptions::new(0.03)).unwrap();
    let pose = cameras_around_the_sphere()[0];
    let (depth, colors) = render(&pose, &[SPHERE]);
    let good = frame(&pose, &depth, &colors);
    let short = vec![1.0; 10];
    let short_colors = vec![[0; 3]; 10];
    let mut bad_k = INTRINSICS;
    bad_k[0][0] = 0.0;
    let mut nan_k = INTRINSICS;
    nan_k[1][2] = f64::NAN;
    let mut not_pinhole = INTRINSICS;
    not_pinhole[2] = [0.0, 0.1, 1.0];
    let mut sheared = pose;
    sheared.rotation[0][0] += 0.01;
    let mut mirrored = pose;
    mirrored.rotation[0] = mirrored.rotation[0].map(|v| -v);
    let mut nan_pose = pose;
    nan_pose.translation[1] = f64::NAN;
    // Each case: the good frame with one thing broken, and what the message says.
    fn with<'a>(good: &DepthFrame<'a>, change: impl FnOnce(&mut DepthFrame<'a>)) -> DepthFrame<'a> {
        let mut frame = good.clone();
        change(&mut frame);
        frame
    }
    let cases: Vec<(DepthFrame, &str)> = vec![
        (with(&good, |f| f.depth = &short), "depth has 10 values"),
        (with(&good, |f| f.weights = Some(&short)), "weights has 10"),
        (
            with(&good, |f| f.colors = Some(&short_colors)),
            "colors has 10",
        ),
        (
            with(&good, |f| {
                (f.width, f.height, f.depth, f.colors) = (0, 0, &[], None)
            }),
            "0 x 0",
        ),
        (
            with(&good, |f| (f.width, f.height) = (usize::MAX, 2)),
            "cannot be integrated",
        ),
        (
            with(&good, |f| (f.width, f.height) = (1 << 24, 1)),
            "cannot be integrated",
        ),
        (with(&good, |f| f.intrinsics = bad_k), "focal"),
        (with(&good, |f| f.intrinsics = nan_k), "not finite"),
        (
            with(&good, |f| f.intrinsics = not_pinhole),
            "upper triangular",
        ),
        (with(&good, |f| f.camera_to_world.scale = 0.0), "scale 0"),
        (
            with(&good, |f| f.camera_to_world.scale = f64::NAN),
            "scale NaN",
        ),
        (with(&good, |f| f.camera_to_world = sheared), "not one"),
        (
            with(&good, |f| f.camera_to_world = mirrored),
            "determinant -1",
        ),
        (with(&good, |f| f.camera_to_world = nan_pose), "not finite"),
    ];
    for (bad, expected) in cases {
        let err = volume.integrate(&bad).unwrap_err().to_string();
        assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        assert_eq!(volume.allocated_blocks(), 0);
    }
    volume.integrate(&good).unwrap();
    assert!(volume.allocated_blocks() > 0);
}

/// An analytic signed distance written straight into the voxels of many blocks: the mesh is
/// closed, so cells at block borders join their neighbours without cracks; a block missing
/// from the middle opens a hole (cells need all their corners measured) but no crack
/// elsewhere.
#[test]
fn block_borders_leave_no_cracks() {
    let voxel = 0.1;
    let mut volume = TsdfVolume::new(TsdfOptions::new(voxel)).unwrap();
    let (centre, radius) = ([0.37, -0.52, 0.21], 1.6);
    let truncation = volume.options.truncation;
    for bz in -4..4 {
        for by in -4..4 {
            for bx in -4..4 {
                let key = [bx, by, bz];
                let mut block = empty_block();
                for (i, voxel_state) in block.iter_mut().enumerate() {
                    let local = [i % 8, i / 8 % 8, i / 64];
                    let p = [0, 1, 2].map(|a| (key[a] * 8 + local[a] as i32) as f64 * voxel);
                    let distance = norm(sub(p, centre)) - radius;
                    *voxel_state = Voxel {
                        tsdf: (distance / truncation).clamp(-1.0, 1.0) as f32,
                        weight: 1.0,
                        color: colour_of(p),
                        colored: true,
                    };
                }
                volume.index.insert(key, volume.blocks.len() as u32);
                volume.blocks.push(block);
            }
        }
    }
    let mesh = volume.extract_mesh();
    assert_eq!(boundary_edges(&mesh), 0);
    for v in &mesh.vertices {
        let d = (norm(sub(v.map(f64::from), centre)) - radius).abs();
        assert!(d < 0.1 * voxel, "{d}");
    }
    // The same mesh whatever order the blocks were allocated in.
    let mut shuffled = TsdfVolume::new(TsdfOptions::new(voxel)).unwrap();
    for (key, block) in contents(&volume).into_iter().rev() {
        shuffled.index.insert(key, shuffled.blocks.len() as u32);
        shuffled.blocks.push(block.try_into().unwrap());
    }
    assert_eq!(shuffled.extract_mesh(), mesh);

    // Unallocate a block the surface crosses: its cells and its neighbours' cells that reach
    // into it are gone, leaving one hole whose rim is in and around that block, and no crack
    // elsewhere.
    let crossed = [1, -1, 1];
    volume.index.remove(&crossed).unwrap();
    let holed = volume.extract_mesh();
    let rim = open_edges(&holed);
    assert!(!rim.is_empty() && holed.triangles.len() < mesh.triangles.len());
    for (a, _) in rim {
        let p = holed.vertices[a as usize].map(|c| (c as f64 / voxel).round() as i32);
        for i in 0..3 {
            let low = crossed[i] * 8 - 1;
            assert!((low..=low + 9).contains(&p[i]), "{p:?}");
        }
    }
}

#[test]
fn a_ground_seen_at_grazing_angles_has_no_holes() {
    let voxel = 0.02;
    // Tilted 2 degrees (rising away from the cameras) and off the lattice's planes.
    let tilt = 2f64.to_radians();
    let ground = Shape::Rectangle {
        centre: [0.0, 0.0137, 3.0],
        axes: [[1.0, 0.0, 0.0], [0.0, -tilt.sin(), tilt.cos()]],
        half: [3.0, 3.0],
    };
    // Cameras 0.5 above the ground, looking ahead and slightly down, walking forward.
    let poses: Vec<Sim3> = (0..4)
        .map(|i| {
            let step = 0.2 * i as f64;
            look_at([0.0, -0.5, step], [0.0, 0.0, 3.0 + step], 1.0)
        })
        .collect();
    let volume = fuse(TsdfOptions::new(voxel), &poses, &[ground]);
    let mesh = volume.extract_mesh();
    let checked = |p: Vec3| p[0].abs() < 0.5 && (1.5..4.0).contains(&p[2]);
    let grid = VertexGrid::new(&mesh, 1.5 * voxel);
    let mut samples = 0;
    for i in 0..=50 {
        for j in 0..=100 {
            let along = -1.5 + j as f64 * 0.025;
            let p = [
                -0.5 + i as f64 * 0.02,
                0.0137 - along * tilt.sin(),
                3.0 + along * tilt.cos(),
            ];
            assert!(grid.nearest(p).is_some(), "no vertex near {p:?}");
            samples += 1;
        }
    }
    let inner_open = open_edges(&mesh)
        .iter()
        .filter(|&&(a, _)| checked(mesh.vertices[a as usize].map(f64::from)))
        .count();
    let mut worst: f64 = 0.0;
    for (v, n) in mesh.vertices.iter().zip(&mesh.normals) {
        let p = v.map(f64::from);
        if checked(p) {
            worst = worst.max(ground.distance(p) / voxel);
            assert!(n[1] < -0.9, "{n:?} at {p:?}");
        }
    }
    eprintln!(
        "grazing ground: {} triangles, {samples} samples covered, {inner_open} open edges \
         inside, largest distance {worst:.3} voxels",
        mesh.triangles.len()
    );
    assert_eq!(inner_open, 0);
    assert!(worst < 1.0, "{worst}");
}
