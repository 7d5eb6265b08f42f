//! A self-contained HTML page that draws a point cloud and its cameras with WebGL.
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

/// Points and line segments in glTF axes, ready to draw.
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

    /// Checks that every array has the length its partner needs and every value is finite.
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
        let finite = |p: &[[f32; 3]]| p.iter().flatten().all(|v| v.is_finite());
        if !finite(&self.positions) || !finite(&self.line_positions) {
            return Err(Error::Input(
                "viewer scene: a position is not finite".into(),
            ));
        }
        Ok(())
    }

    /// The scene as the page embeds it, with at most `max_points` points (evenly strided, as
    /// [`super::point_cloud`] caps).
    pub fn to_json(&self, max_points: usize) -> serde_json::Value {
        let n = self.positions.len();
        let keep: Vec<usize> = if n > max_points {
            (0..max_points).map(|j| j * n / max_points).collect()
        } else {
            (0..n).collect()
        };
        let b64 = |bytes: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(bytes);
        let f32s = |points: &mut dyn Iterator<Item = &[f32; 3]>| {
            b64(points.flatten().flat_map(|v| v.to_le_bytes()).collect())
        };
        let u8s =
            |colors: &mut dyn Iterator<Item = &[u8; 3]>| b64(colors.flatten().copied().collect());
        json!({
            "format": "da3-viewer-1",
            "points": keep.len(),
            "total_points": n,
            "lines": self.line_positions.len() / 2,
            "cameras": self.cameras,
            "positions": f32s(&mut keep.iter().map(|&i| &self.positions[i])),
            "colors": u8s(&mut keep.iter().map(|&i| &self.colors[i])),
            "line_positions": f32s(&mut self.line_positions.iter()),
            "line_colors": u8s(&mut self.line_colors.iter()),
        })
    }
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

/// The viewer page for `scene` (at most `max_points` points), titled `title`.
///
/// # Errors
/// [`Error::Input`] for an invalid scene ([`ViewerScene::validate`]) or a cap of 0.
pub fn viewer_html(scene: &ViewerScene, title: &str, max_points: usize) -> Result<String, Error> {
    scene.validate()?;
    if max_points == 0 {
        return Err(Error::Input("a viewer point cap of 0 shows nothing".into()));
    }
    // The JSON holds numbers, ASCII keys and base64 only: nothing that could close the
    // script element.
    let data = scene.to_json(max_points).to_string();
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
    max_points: usize,
) -> Result<(), Error> {
    let html = viewer_html(scene, title, max_points)?;
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
        }
    }

    fn embedded(html: &str) -> serde_json::Value {
        let start = html.find(r#"id="da3-scene">"#).unwrap() + r#"id="da3-scene">"#.len();
        let end = start + html[start..].find("</script>").unwrap();
        serde_json::from_str(&html[start..end]).unwrap()
    }

    #[test]
    fn page_embeds_the_capped_scene_and_the_code() {
        let html = viewer_html(&scene(10), "a <b> & \"c\"", 4).unwrap();
        assert!(html.contains("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"));
        assert!(html.contains("function da3Viewer("));
        assert!(!html.contains("{{"), "a placeholder is left");
        assert!(!html.contains("src=\"http"), "the page loads nothing");
        let data = embedded(&html);
        assert_eq!(data["points"], 4);
        assert_eq!(data["total_points"], 10);
        assert_eq!(data["lines"], 1);
        let pos = base64::engine::general_purpose::STANDARD
            .decode(data["positions"].as_str().unwrap())
            .unwrap();
        let xs: Vec<f32> = pos
            .chunks_exact(12)
            .map(|c| f32::from_le_bytes(c[..4].try_into().unwrap()))
            .collect();
        assert_eq!(xs, [0.0, 2.0, 5.0, 7.0]); // j * 10 / 4
        let colors = base64::engine::general_purpose::STANDARD
            .decode(data["colors"].as_str().unwrap())
            .unwrap();
        assert_eq!(colors, [0, 1, 2, 2, 1, 2, 5, 1, 2, 7, 1, 2]);
    }

    #[test]
    fn bad_scenes_are_errors() {
        let mut s = scene(3);
        s.colors.pop();
        assert!(viewer_html(&s, "t", 10).is_err());
        let mut s = scene(3);
        s.line_positions.pop();
        s.line_colors.pop();
        assert!(viewer_html(&s, "t", 10).is_err());
        let mut s = scene(3);
        s.positions[1][2] = f32::NAN;
        assert!(viewer_html(&s, "t", 10).is_err());
        assert!(viewer_html(&scene(3), "t", 0).is_err());
    }
}
