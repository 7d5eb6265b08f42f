//! A self-contained HTML page that draws a point cloud, a triangle mesh and line segments
//! (camera frustums, trajectories) with WebGL.
//!
//! The page is one file: the template (`viewer.html`), our own WebGL code (`viewer.js`, no
//! libraries, nothing fetched when it is opened) and the scene, embedded as JSON in a
//! `<script type="application/json" id="da3-scene">` element:
//!
//! | field | meaning |
//! |---|---|
//! | `format` | `"da3-viewer-1"` |
//! | `points`, `lines`, `cameras` | counts: points drawn, line segments, camera frustums |
//! | `total_points` | points before the cap |
//! | `positions` | base64 of little-endian `f32` x, y, z per point |
//! | `colors` | base64 of `u8` r, g, b per point |
//! | `line_positions` | base64 of `f32` x, y, z per segment endpoint (two per segment) |
//! | `line_colors` | base64 of `u8` r, g, b per endpoint |
//! | `triangles`, `total_triangles` | triangles drawn, triangles before the cap |
//! | `mesh_vertices` | vertices the drawn triangles use |
//! | `mesh_positions` | base64 of `f32` x, y, z per mesh vertex |
//! | `mesh_colors` | base64 of `u8` r, g, b per mesh vertex |
//! | `mesh_normals` | base64 of `i8` x, y, z per mesh vertex (unit normal x 127); absent: the page computes them |
//! | `mesh_indices` | base64 of little-endian `u32` vertex indices, three per triangle |
//! | `gaussians`, `total_gaussians` | 3D Gaussians drawn, Gaussians before the cap |
//! | `gs_positions` | base64 of `f32` x, y, z per Gaussian (its centre) |
//! | `gs_colors` | base64 of `u8` r, g, b, opacity per Gaussian (its colour seen head-on: the DC band) |
//! | `gs_covariances` | base64 of `f32` xx, xy, xz, yy, yz, zz per Gaussian (its 3D covariance) |
//!
//! The mesh fields are there only when the scene has triangles, and the Gaussian fields only
//! when it has Gaussians, so a scene without them encodes as it did before they were added.
//! The page splats the Gaussians (3DGS's projection of each covariance, blended back to
//! front), sorting them by depth when the view changes. Normals go as 8-bit snorm (what WebGL reads as
//! a normalised `BYTE` attribute): a quarter of `f32`'s bytes and plenty for shading.
//!
//! Above [`ViewerCaps::max_triangles`] the page keeps an evenly strided subset (triangle
//! `floor(j * n / cap)` for `j < cap`: every k-th when `n = k * cap`), the same rule as for
//! points. That thins the surface evenly (it shows holes, never a cut-off region) and costs
//! one pass; vertices no kept triangle uses are dropped from the page.
//!
//! Axes are glTF's (x right, y up, z towards the viewer). [`ViewerScene::new`] puts the
//! points and frustums in exactly the frame [`super::write_glb`] writes (the first camera's,
//! centred on the median point), so a page and a glb of one prediction show the same scene.

use super::super::Error;
use super::glb::{alignment, check_scene, frustum, index_color, scene_scale, transform};
use super::{GlbOptions, PointCloud, View};
use crate::atomic_file;
use base64::Engine as _;
use serde_json::json;
use std::path::Path;

/// The viewer's JavaScript (WebGL 1, no dependencies): `da3Viewer(canvas, scene, options)`
/// draws an encoded scene ([`ViewerScene::to_json`]) with an orbit camera. `da3 serve`'s page
/// uses it too.
pub const VIEWER_JS: &str = include_str!("viewer.js");

const TEMPLATE: &str = include_str!("viewer.html");

/// Default cap on the points a page embeds (about 20 bytes of base64 each).
pub const DEFAULT_VIEWER_POINTS: usize = 300_000;

/// Default cap on the triangles a page embeds: about 16 bytes of base64 each for the indices,
/// plus about 24 per vertex (a fused mesh has about half as many vertices as triangles), so
/// about 28 MB for a million; browsers load that in a second or two.
pub const DEFAULT_VIEWER_TRIANGLES: usize = 1_000_000;

/// How much of a scene a page embeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewerCaps {
    /// Most points (evenly strided above it).
    pub max_points: usize,
    /// Most triangles (evenly strided above it).
    pub max_triangles: usize,
}

impl Default for ViewerCaps {
    fn default() -> Self {
        ViewerCaps {
            max_points: DEFAULT_VIEWER_POINTS,
            max_triangles: DEFAULT_VIEWER_TRIANGLES,
        }
    }
}

/// Points, a triangle mesh and line segments in glTF axes, ready to draw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewerScene {
    pub positions: Vec<[f32; 3]>,
    pub colors: Vec<[u8; 3]>,
    /// Segment endpoints, two per segment.
    pub line_positions: Vec<[f32; 3]>,
    /// One colour per endpoint.
    pub line_colors: Vec<[u8; 3]>,
    /// How many camera frustums the segments draw.
    pub cameras: usize,
    /// The mesh's vertices (shared by its triangles).
    pub mesh_positions: Vec<[f32; 3]>,
    /// One colour per mesh vertex.
    pub mesh_colors: Vec<[u8; 3]>,
    /// One normal per mesh vertex (any length but zero; the page normalises), or empty: the
    /// page then computes them from the triangles.
    pub mesh_normals: Vec<[f32; 3]>,
    /// Three indices into `mesh_positions` per triangle.
    pub triangles: Vec<[u32; 3]>,
    /// 3D Gaussians: centres, colour and opacity, and covariances (xx, xy, xz, yy, yz, zz).
    pub gaussian_positions: Vec<[f32; 3]>,
    pub gaussian_colors: Vec<[u8; 4]>,
    pub gaussian_covariances: Vec<[f32; 6]>,
}

impl ViewerScene {
    /// `cloud` (from [`super::point_cloud`] over `views`) and one frustum per view, in the frame
    /// and with the frustum size and colours of [`super::write_glb`].
    ///
    /// # Errors
    /// [`Error::Input`] when `views` is empty or invalid, or the cloud's arrays disagree.
    pub fn new(
        cloud: &PointCloud,
        views: &[View<'_>],
        options: &GlbOptions,
    ) -> Result<ViewerScene, Error> {
        let first = check_scene(cloud, views, "a viewer scene")?;
        let a = alignment(first, cloud);
        let moved: Vec<[f64; 3]> = cloud
            .positions
            .iter()
            .map(|p| transform(&a, p.map(f64::from)))
            .collect();
        let mut scene = ViewerScene {
            positions: moved.iter().map(|p| p.map(|v| v as f32)).collect(),
            colors: cloud.colors.clone(),
            ..Default::default()
        };
        if options.cameras {
            let scale = scene_scale(&moved) * options.camera_size;
            for (i, v) in views.iter().enumerate() {
                for p in frustum(v, scale) {
                    scene
                        .line_positions
                        .push(transform(&a, p).map(|c| c as f32));
                    scene.line_colors.push(index_color(i, views.len()));
                }
            }
            scene.cameras = views.len();
        }
        Ok(scene)
    }

    /// Adds a path through `points` (a camera trajectory, say) as `points.len() - 1` segments
    /// of one colour; fewer than two points add nothing. It does not count as a camera.
    pub fn add_polyline(&mut self, points: &[[f32; 3]], color: [u8; 3]) {
        for pair in points.windows(2) {
            self.line_positions.extend_from_slice(pair);
            self.line_colors.extend([color, color]);
        }
    }

    /// Adds a triangle mesh: its vertices, one colour per vertex, optionally one normal per
    /// vertex, and triangles indexing this mesh's vertices (from 0; they are shifted past the
    /// vertices already in the scene). Where one part of the scene's mesh has normals and
    /// another has none, the missing ones are computed here (area-weighted face normals), so
    /// [`ViewerScene::mesh_normals`] stays either empty or complete.
    ///
    /// # Errors
    /// [`Error::Input`] when the lengths disagree, an index is out of range, a position or a
    /// normal is not finite, or the scene would pass `u32::MAX` vertices; the scene is then
    /// unchanged.
    pub fn add_mesh(
        &mut self,
        positions: &[[f32; 3]],
        colors: &[[u8; 3]],
        normals: Option<&[[f32; 3]]>,
        triangles: &[[u32; 3]],
    ) -> Result<(), Error> {
        check_mesh(positions, colors, normals.unwrap_or(&[]), triangles)?;
        let offset = self.mesh_positions.len();
        let base = u32::try_from(offset)
            .ok()
            .filter(|b| u32::try_from(positions.len()).is_ok_and(|n| b.checked_add(n).is_some()))
            .ok_or_else(|| {
                Error::Input(format!(
                    "mesh: {offset} + {} vertices is more than a viewer scene holds (u32 indices)",
                    positions.len()
                ))
            })?;
        let scene_has_normals = !self.mesh_normals.is_empty();
        match normals {
            Some(n) => {
                if offset > 0 && !scene_has_normals {
                    // The fields are public: check the mesh already there before indexing
                    // with its triangles.
                    check_mesh(
                        &self.mesh_positions,
                        &self.mesh_colors,
                        &[],
                        &self.triangles,
                    )?;
                    self.mesh_normals = vertex_normals(&self.mesh_positions, &self.triangles);
                }
                self.mesh_normals.extend_from_slice(n);
            }
            None if scene_has_normals => self
                .mesh_normals
                .extend(vertex_normals(positions, triangles)),
            None => {}
        }
        self.mesh_positions.extend_from_slice(positions);
        self.mesh_colors.extend_from_slice(colors);
        self.triangles
            .extend(triangles.iter().map(|t| t.map(|i| i + base)));
        Ok(())
    }

    /// Checks that every array has the length its partner needs, every value is finite and
    /// every triangle's indices are in range.
    ///
    /// # Errors
    /// [`Error::Input`] naming the mismatch.
    pub fn validate(&self) -> Result<(), Error> {
        if self.colors.len() != self.positions.len() {
            return Err(Error::Input(format!(
                "viewer scene: {} positions but {} colours",
                self.positions.len(),
                self.colors.len()
            )));
        }
        if self.line_colors.len() != self.line_positions.len()
            || !self.line_positions.len().is_multiple_of(2)
        {
            return Err(Error::Input(format!(
                "viewer scene: {} segment endpoints and {} endpoint colours (two endpoints per \
                 segment, one colour each)",
                self.line_positions.len(),
                self.line_colors.len()
            )));
        }
        let n = self.gaussian_positions.len();
        if self.gaussian_colors.len() != n || self.gaussian_covariances.len() != n {
            return Err(Error::Input(format!(
                "viewer scene: {n} Gaussian centres, {} colours and {} covariances",
                self.gaussian_colors.len(),
                self.gaussian_covariances.len()
            )));
        }
        let finite = |p: &[[f32; 3]]| p.iter().flatten().all(|v| v.is_finite());
        if !self
            .gaussian_covariances
            .iter()
            .flatten()
            .all(|v| v.is_finite())
            || !finite(&self.gaussian_positions)
        {
            return Err(Error::Input(
                "viewer scene: a Gaussian is not finite".into(),
            ));
        }
        if !finite(&self.positions) || !finite(&self.line_positions) {
            return Err(Error::Input(
                "viewer scene: a position is not finite".into(),
            ));
        }
        check_mesh(
            &self.mesh_positions,
            &self.mesh_colors,
            &self.mesh_normals,
            &self.triangles,
        )
    }

    /// The scene as the page embeds it, with at most `max_points` points (evenly strided, as
    /// [`super::point_cloud`] caps) and at most [`DEFAULT_VIEWER_TRIANGLES`] triangles.
    ///
    /// # Panics
    /// On a scene that [`ViewerScene::validate`] refuses (as [`viewer_html`] checks first).
    pub fn to_json(&self, max_points: usize) -> serde_json::Value {
        self.to_json_capped(&ViewerCaps {
            max_points,
            ..ViewerCaps::default()
        })
    }

    /// The scene as the page embeds it, within `caps` (both evenly strided above them).
    ///
    /// # Panics
    /// On a scene that [`ViewerScene::validate`] refuses (as [`viewer_html`] checks first).
    pub fn to_json_capped(&self, caps: &ViewerCaps) -> serde_json::Value {
        let n = self.positions.len();
        let keep = strided(n, caps.max_points);
        let mut out = json!({
            "format": "da3-viewer-1",
            "points": keep.len(),
            "total_points": n,
            "lines": self.line_positions.len() / 2,
            "cameras": self.cameras,
            "positions": f32s_base64(keep.iter().map(|&i| &self.positions[i])),
            "colors": u8s_base64(keep.iter().map(|&i| &self.colors[i])),
            "line_positions": f32s_base64(self.line_positions.iter()),
            "line_colors": u8s_base64(self.line_colors.iter()),
        });
        if !self.triangles.is_empty() {
            self.mesh_json(caps.max_triangles, &mut out);
        }
        if !self.gaussian_positions.is_empty() {
            let kept = strided(self.gaussian_positions.len(), caps.max_points);
            let map = out.as_object_mut().expect("an object");
            map.insert("gaussians".into(), kept.len().into());
            map.insert(
                "total_gaussians".into(),
                self.gaussian_positions.len().into(),
            );
            map.insert(
                "gs_positions".into(),
                f32s_base64(kept.iter().map(|&i| &self.gaussian_positions[i])).into(),
            );
            let colors: Vec<u8> = kept.iter().flat_map(|&i| self.gaussian_colors[i]).collect();
            map.insert("gs_colors".into(), base64_text(colors).into());
            let covariances: Vec<u8> = kept
                .iter()
                .flat_map(|&i| self.gaussian_covariances[i])
                .flat_map(f32::to_le_bytes)
                .collect();
            map.insert("gs_covariances".into(), base64_text(covariances).into());
        }
        out
    }

    /// Adds 3D Gaussians in the viewer's axes: centres, colours as their DC band gives them
    /// (`0.5 + C0 x f_dc`), opacities in 0..1, scales (standard deviations) and rotations as
    /// quaternions (w, x, y, z; normalised here). Covariances are `R S^2 R^T`.
    ///
    /// # Errors
    /// [`Error::Input`] when the lengths disagree.
    pub fn add_gaussians(
        &mut self,
        positions: &[[f32; 3]],
        dc: &[[f32; 3]],
        opacities: &[f32],
        scales: &[[f32; 3]],
        rotations: &[[f32; 4]],
    ) -> Result<(), Error> {
        let n = positions.len();
        if [dc.len(), opacities.len(), scales.len(), rotations.len()] != [n; 4] {
            return Err(Error::Input(format!(
                "Gaussians: {n} centres, {} colours, {} opacities, {} scales, {} rotations",
                dc.len(),
                opacities.len(),
                scales.len(),
                rotations.len()
            )));
        }
        const C0: f32 = 0.282_094_8;
        let byte = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
        self.gaussian_positions.extend_from_slice(positions);
        self.gaussian_colors
            .extend(dc.iter().zip(opacities).map(|(c, &o)| {
                [
                    byte(0.5 + C0 * c[0]),
                    byte(0.5 + C0 * c[1]),
                    byte(0.5 + C0 * c[2]),
                    byte(o),
                ]
            }));
        self.gaussian_covariances
            .extend(scales.iter().zip(rotations).map(|(s, q)| {
                let c = crate::da3::gaussians::covariance(*q, *s);
                [c[0][0], c[0][1], c[0][2], c[1][1], c[1][2], c[2][2]].map(|v| v as f32)
            }));
        Ok(())
    }

    /// The mesh fields of [`ViewerScene::to_json_capped`]: the kept triangles, renumbered over
    /// the vertices they use (in the scene's vertex order).
    fn mesh_json(&self, max_triangles: usize, out: &mut serde_json::Value) {
        let kept = strided(self.triangles.len(), max_triangles);
        const UNUSED: u32 = u32::MAX;
        let mut new_index = vec![UNUSED; self.mesh_positions.len()];
        for &t in &kept {
            for i in self.triangles[t] {
                new_index[i as usize] = 0;
            }
        }
        let mut used = Vec::new();
        for (old, slot) in new_index.iter_mut().enumerate() {
            if *slot != UNUSED {
                *slot = used.len() as u32;
                used.push(old);
            }
        }
        let indices: Vec<u8> = kept
            .iter()
            .flat_map(|&t| self.triangles[t])
            .flat_map(|i| new_index[i as usize].to_le_bytes())
            .collect();
        let map = out.as_object_mut().expect("an object");
        map.insert("triangles".into(), kept.len().into());
        map.insert("total_triangles".into(), self.triangles.len().into());
        map.insert("mesh_vertices".into(), used.len().into());
        map.insert(
            "mesh_positions".into(),
            f32s_base64(used.iter().map(|&i| &self.mesh_positions[i])).into(),
        );
        map.insert(
            "mesh_colors".into(),
            u8s_base64(used.iter().map(|&i| &self.mesh_colors[i])).into(),
        );
        if !self.mesh_normals.is_empty() {
            let snorm: Vec<u8> = used
                .iter()
                .flat_map(|&i| snorm8(self.mesh_normals[i]))
                .collect();
            map.insert("mesh_normals".into(), base64_text(snorm).into());
        }
        map.insert("mesh_indices".into(), base64_text(indices).into());
    }
}

/// Indices of at most `cap` of `n` items, evenly strided: `j * n / cap` for `j < cap`.
fn strided(n: usize, cap: usize) -> Vec<usize> {
    if n > cap {
        (0..cap).map(|j| j * n / cap).collect()
    } else {
        (0..n).collect()
    }
}

fn base64_text(bytes: Vec<u8>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn f32s_base64<'a>(points: impl Iterator<Item = &'a [f32; 3]>) -> String {
    base64_text(points.flatten().flat_map(|v| v.to_le_bytes()).collect())
}

fn u8s_base64<'a>(colors: impl Iterator<Item = &'a [u8; 3]>) -> String {
    base64_text(colors.flatten().copied().collect())
}

/// A normal as WebGL's normalised signed bytes (unit length x 127); zero stays zero.
fn snorm8(n: [f32; 3]) -> [u8; 3] {
    let length = n.iter().map(|v| v * v).sum::<f32>().sqrt();
    let scale = if length > 0.0 { 127.0 / length } else { 0.0 };
    n.map(|v| ((v * scale).round().clamp(-127.0, 127.0) as i8) as u8)
}

/// The checks of [`ViewerScene::add_mesh`] and [`ViewerScene::validate`] for one mesh;
/// `normals` empty means none.
fn check_mesh(
    positions: &[[f32; 3]],
    colors: &[[u8; 3]],
    normals: &[[f32; 3]],
    triangles: &[[u32; 3]],
) -> Result<(), Error> {
    if colors.len() != positions.len() {
        return Err(Error::Input(format!(
            "mesh: {} vertices but {} colours",
            positions.len(),
            colors.len()
        )));
    }
    if !normals.is_empty() && normals.len() != positions.len() {
        return Err(Error::Input(format!(
            "mesh: {} vertices but {} normals",
            positions.len(),
            normals.len()
        )));
    }
    if let Some(i) = positions
        .iter()
        .position(|p| !p.iter().all(|v| v.is_finite()))
    {
        return Err(Error::Input(format!(
            "mesh: vertex {i}'s position is not finite"
        )));
    }
    if let Some(i) = normals
        .iter()
        .position(|p| !p.iter().all(|v| v.is_finite()))
    {
        return Err(Error::Input(format!(
            "mesh: vertex {i}'s normal is not finite"
        )));
    }
    let n = positions.len();
    if let Some((t, i)) = triangles
        .iter()
        .enumerate()
        .find_map(|(t, tri)| tri.iter().find(|&&i| i as usize >= n).map(|&i| (t, i)))
    {
        return Err(Error::Input(format!(
            "mesh: triangle {t} uses vertex {i}, but there are {n} vertices"
        )));
    }
    Ok(())
}

/// Per-vertex normals: the sum of the (area-weighted) normals of the triangles around each
/// vertex. Unused vertices get a zero normal, which the page lights with ambient light only.
fn vertex_normals(positions: &[[f32; 3]], triangles: &[[u32; 3]]) -> Vec<[f32; 3]> {
    let mut normals = vec![[0.0f32; 3]; positions.len()];
    for t in triangles {
        let [a, b, c] = t.map(|i| positions[i as usize]);
        let (u, v) = (
            [0, 1, 2].map(|k| b[k] - a[k]),
            [0, 1, 2].map(|k| c[k] - a[k]),
        );
        let face = [
            u[1] * v[2] - u[2] * v[1],
            u[2] * v[0] - u[0] * v[2],
            u[0] * v[1] - u[1] * v[0],
        ];
        for i in t {
            for k in 0..3 {
                normals[*i as usize][k] += face[k];
            }
        }
    }
    normals
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The viewer page for `scene` (within `caps`), titled `title`.
///
/// # Errors
/// [`Error::Input`] for an invalid scene ([`ViewerScene::validate`]) or a cap of 0.
pub fn viewer_html(scene: &ViewerScene, title: &str, caps: &ViewerCaps) -> Result<String, Error> {
    scene.validate()?;
    if caps.max_points == 0 || caps.max_triangles == 0 {
        return Err(Error::Input(
            "a viewer cap of 0 (points or triangles) shows nothing".into(),
        ));
    }
    // The JSON holds numbers, ASCII keys and base64 only: nothing that could close the
    // script element.
    let data = scene.to_json_capped(caps).to_string();
    let title = escape_html(title);
    // The title goes in last: text in it that looks like a placeholder stays text.
    Ok(TEMPLATE
        .replace("{{SCENE}}", &data)
        .replace("{{VIEWER_JS}}", VIEWER_JS)
        .replace("{{TITLE}}", &title))
}

/// Writes [`viewer_html`] to `path` (atomically).
///
/// # Errors
/// As [`viewer_html`], and [`Error::Output`] when the file cannot be written.
pub fn write_viewer(
    path: &Path,
    scene: &ViewerScene,
    title: &str,
    caps: &ViewerCaps,
) -> Result<(), Error> {
    let html = viewer_html(scene, title, caps)?;
    Ok(atomic_file::write(path, |w| w.write_all(html.as_bytes()))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scene(n: usize) -> ViewerScene {
        ViewerScene {
            positions: (0..n).map(|i| [i as f32, 0.5, -1.0]).collect(),
            colors: (0..n).map(|i| [i as u8, 1, 2]).collect(),
            line_positions: vec![[0.0; 3], [1.0, 2.0, 3.0]],
            line_colors: vec![[255, 0, 0]; 2],
            cameras: 1,
            ..Default::default()
        }
    }

    fn points(n: usize) -> ViewerCaps {
        ViewerCaps {
            max_points: n,
            ..ViewerCaps::default()
        }
    }

    fn embedded(html: &str) -> serde_json::Value {
        let start = html.find(r#"id="da3-scene">"#).unwrap() + r#"id="da3-scene">"#.len();
        let end = start + html[start..].find("</script>").unwrap();
        serde_json::from_str(&html[start..end]).unwrap()
    }

    fn decode(v: &serde_json::Value) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    }

    struct Strip {
        positions: Vec<[f32; 3]>,
        colors: Vec<[u8; 3]>,
        triangles: Vec<[u32; 3]>,
    }

    /// A strip of `n` triangles over `n + 2` vertices along x, all wound the same way.
    fn strip(n: u32) -> Strip {
        let positions = (0..n + 2)
            .map(|i| [i as f32, (i % 2) as f32, 0.0])
            .collect();
        let colors = (0..n + 2).map(|i| [i as u8, 7, 9]).collect();
        let triangles = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    [i, i + 1, i + 2]
                } else {
                    [i + 1, i, i + 2]
                }
            })
            .collect();
        Strip {
            positions,
            colors,
            triangles,
        }
    }

    #[test]
    fn page_embeds_the_capped_scene_and_the_code() {
        let html = viewer_html(&scene(10), "a <b> & \"c\"", &points(4)).unwrap();
        assert!(html.contains("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"));
        assert!(html.contains("function da3Viewer("));
        assert!(!html.contains("{{"), "a placeholder is left");
        assert!(!html.contains("src=\"http"), "the page loads nothing");
        let data = embedded(&html);
        assert_eq!(data["points"], 4);
        assert_eq!(data["total_points"], 10);
        assert_eq!(data["lines"], 1);
        assert!(
            data.get("triangles").is_none(),
            "no mesh fields without a mesh"
        );
        let pos = decode(&data["positions"]);
        let xs: Vec<f32> = pos
            .chunks_exact(12)
            .map(|c| f32::from_le_bytes(c[..4].try_into().unwrap()))
            .collect();
        assert_eq!(xs, [0.0, 2.0, 5.0, 7.0]); // j * 10 / 4
        assert_eq!(
            decode(&data["colors"]),
            [0, 1, 2, 2, 1, 2, 5, 1, 2, 7, 1, 2]
        );
    }

    #[test]
    fn a_capped_mesh_keeps_strided_triangles_and_only_their_vertices() {
        let Strip {
            positions,
            colors,
            triangles,
        } = strip(10);
        let mut s = ViewerScene::default();
        s.add_mesh(&positions, &colors, None, &triangles).unwrap();
        let caps = ViewerCaps {
            max_points: 1,
            max_triangles: 3,
        };
        let data = embedded(&viewer_html(&s, "t", &caps).unwrap());
        assert_eq!(data["triangles"], 3);
        assert_eq!(data["total_triangles"], 10);
        // Triangles 0, 3, 6 (j * 10 / 3) use vertices 0..=2, 3..=5, 6..=8.
        assert_eq!(data["mesh_vertices"], 9);
        let indices: Vec<u32> = decode(&data["mesh_indices"])
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(indices, [0, 1, 2, 4, 3, 5, 6, 7, 8]);
        assert_eq!(decode(&data["mesh_colors"])[..6], [0, 7, 9, 1, 7, 9]);
        assert!(data.get("mesh_normals").is_none(), "the page computes them");
        // Uncapped, every vertex stays.
        let data = s.to_json(10);
        assert_eq!(
            (data["triangles"].as_u64(), data["mesh_vertices"].as_u64()),
            (Some(10), Some(12))
        );
    }

    #[test]
    fn meshes_append_with_shifted_indices_and_complete_normals() {
        let Strip {
            positions,
            colors,
            triangles,
        } = strip(2);
        let mut s = ViewerScene::default();
        s.add_mesh(&positions, &colors, None, &triangles).unwrap();
        assert!(s.mesh_normals.is_empty());
        let normals = vec![[0.0, 0.0, 2.0]; 4];
        s.add_mesh(&positions, &colors, Some(&normals), &triangles)
            .unwrap();
        assert_eq!(s.triangles[2], [4, 5, 6]);
        assert_eq!(s.mesh_normals.len(), 8);
        // The first strip's computed normals point along z (its triangles lie in z = 0).
        assert!(s.mesh_normals[..4]
            .iter()
            .all(|n| n[0] == 0.0 && n[1] == 0.0 && n[2] != 0.0));
        let data = s.to_json(1);
        assert_eq!(decode(&data["mesh_normals"])[12..15], [0, 0, 127]);

        s.add_polyline(&[[0.0; 3], [1.0; 3], [2.0; 3]], [9, 9, 9]);
        assert_eq!(s.line_positions.len(), 4);
        assert_eq!(s.cameras, 0);
        s.validate().unwrap();
    }

    #[test]
    fn bad_scenes_are_errors() {
        let mut s = scene(3);
        s.colors.pop();
        assert!(viewer_html(&s, "t", &points(10)).is_err());
        let mut s = scene(3);
        s.line_positions.pop();
        s.line_colors.pop();
        assert!(viewer_html(&s, "t", &points(10)).is_err());
        let mut s = scene(3);
        s.positions[1][2] = f32::NAN;
        assert!(viewer_html(&s, "t", &points(10)).is_err());
        assert!(viewer_html(&scene(3), "t", &points(0)).is_err());

        let Strip {
            positions,
            colors,
            mut triangles,
        } = strip(2);
        triangles[1][2] = 4;
        let mut s = ViewerScene::default();
        let err = s
            .add_mesh(&positions, &colors, None, &triangles)
            .unwrap_err();
        assert!(
            err.to_string().contains("triangle 1 uses vertex 4"),
            "{err}"
        );
        assert_eq!(s, ViewerScene::default(), "a refused mesh adds nothing");
        assert!(s.add_mesh(&positions, &colors[1..], None, &[]).is_err());
        assert!(s
            .add_mesh(&positions, &colors, Some(&[[0.0; 3]]), &[])
            .is_err());
        s.mesh_positions = positions;
        s.mesh_colors = colors;
        s.triangles = triangles;
        assert!(s.validate().is_err());
    }
}
