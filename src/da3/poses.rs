//! Known cameras in: the official path of `DepthAnything3.inference(images, extrinsics,
//! intrinsics)` (depth-anything-3 0.1.1, `api.py`) around the network.
//!
//! 1. The InputProcessor scales each view's intrinsics with its resizes (`_resize_ixt`: the
//!    first row by the width ratio, the second by the height ratio, once per resize step);
//!    extrinsics pass through.
//! 2. `_normalize_extrinsics`: every world-to-camera matrix is right-multiplied by the inverse
//!    of view 0's (view 0 becomes the identity), then the translations are divided by the
//!    median distance of the camera centres from view 0's (`torch.median`: the lower middle
//!    value for an even count), clamped to at least 0.1.
//! 3. The camera encoder (`CameraEnc`) takes, per view, the camera-to-world inverse of the
//!    normalised matrix as `[t, quaternion xyzw, fov_h, fov_w]`
//!    (`extri_intri_to_pose_encoding`, fov = 2 atan(side / 2 / focal) of the processed size)
//!    and its tokens replace token 0 of every view at `alt_start`; no reference view is
//!    selected (view 0 stays the reference, [`SELECTION_MIN_VIEWS`] does not apply).
//! 4. `_align_to_input_extrinsics_intrinsics`: the Umeyama Sim(3) (evo, with scale) that maps
//!    the input camera centres onto the predicted ones gives a scale `s`; depth is divided by
//!    `s`, and the output cameras are the input extrinsics and the processed intrinsics.
//!
//! Where this differs from the official code: with two views (or three on one line) evo
//! refuses the alignment ("Degenerate covariance rank"); here the scale is Umeyama's formula
//! on the rank it has (for two views, the ratio of the predicted to the given baseline). With
//! ten views or more the official code fits the scale by RANSAC over seeded random subsets;
//! here it is the plain Umeyama fit on every view (the same where the poses agree).
//!
//! [`SELECTION_MIN_VIEWS`]: super::multiview::SELECTION_MIN_VIEWS

use super::outputs::Pose;
use super::preprocess::ResizePlan;
use super::Error;
use std::path::Path;

/// A 4x4 matrix, rows first.
pub type Mat4 = [[f64; 4]; 4];
/// A 3x3 matrix, rows first.
pub type Mat3 = [[f64; 3]; 3];

/// One view's known camera: world-to-camera extrinsics and pinhole intrinsics in pixels of
/// the input image (as the official `inference` takes them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnownPose {
    /// World-to-camera `[R | t]` with the last row `0 0 0 1`.
    pub extrinsics: Mat4,
    /// `[[fx, s, cx], [0, fy, cy], [0, 0, 1]]` in pixels of the input image.
    pub intrinsics: Mat3,
}

impl KnownPose {
    /// A pose from a 3x4 or 4x4 world-to-camera matrix and 3x3 intrinsics (rows first),
    /// checked: finite values, a rotation block that is a rotation (orthonormal within 1e-3,
    /// determinant +1), positive focal lengths.
    pub fn new(extrinsics: &[Vec<f64>], intrinsics: &[Vec<f64>]) -> Result<KnownPose, Error> {
        let bad = |what: String| Error::Input(format!("camera pose: {what}"));
        if !(extrinsics.len() == 3 || extrinsics.len() == 4)
            || extrinsics.iter().any(|r| r.len() != 4)
        {
            return Err(bad("extrinsics must be a 3x4 or 4x4 matrix".into()));
        }
        if intrinsics.len() != 3 || intrinsics.iter().any(|r| r.len() != 3) {
            return Err(bad("intrinsics must be a 3x3 matrix".into()));
        }
        let mut e = identity4();
        for (i, row) in extrinsics.iter().take(3).enumerate() {
            e[i].copy_from_slice(row);
        }
        let mut k = [[0.0; 3]; 3];
        for (i, row) in intrinsics.iter().enumerate() {
            k[i].copy_from_slice(row);
        }
        let finite = e
            .iter()
            .flatten()
            .chain(k.iter().flatten())
            .all(|v| v.is_finite())
            && extrinsics.iter().flatten().all(|v| v.is_finite());
        if !finite {
            return Err(bad("a value is not finite".into()));
        }
        if extrinsics.len() == 4 && extrinsics[3] != [0.0, 0.0, 0.0, 1.0] {
            return Err(bad("the last extrinsics row must be 0 0 0 1".into()));
        }
        let r = rotation(&e);
        let mut worst: f64 = 0.0;
        for i in 0..3 {
            for j in 0..3 {
                let dot: f64 = (0..3).map(|c| r[i][c] * r[j][c]).sum();
                worst = worst.max((dot - f64::from(u8::from(i == j))).abs());
            }
        }
        if worst > 1e-3 || det3(&r) < 0.0 {
            return Err(bad(format!(
                "the extrinsics' 3x3 block is not a rotation (orthonormality error {worst:.2e}, \
                 determinant {:.4})",
                det3(&r)
            )));
        }
        if k[0][0] <= 0.0 || k[1][1] <= 0.0 || k[2] != [0.0, 0.0, 1.0] || k[1][0] != 0.0 {
            return Err(bad(
                "intrinsics must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0".into(),
            ));
        }
        Ok(KnownPose {
            extrinsics: e,
            intrinsics: k,
        })
    }

    /// The camera centre in world coordinates (`-R^T t`).
    pub fn centre(&self) -> [f64; 3] {
        centre(&self.extrinsics)
    }
}

fn identity4() -> Mat4 {
    let mut m = [[0.0; 4]; 4];
    for (i, row) in m.iter_mut().enumerate() {
        row[i] = 1.0;
    }
    m
}

fn rotation(m: &Mat4) -> Mat3 {
    [
        [m[0][0], m[0][1], m[0][2]],
        [m[1][0], m[1][1], m[1][2]],
        [m[2][0], m[2][1], m[2][2]],
    ]
}

fn det3(m: &Mat3) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

fn mul4(a: &Mat4, b: &Mat4) -> Mat4 {
    let mut m = [[0.0; 4]; 4];
    for i in 0..4 {
        for j in 0..4 {
            m[i][j] = (0..4).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    m
}

/// The official `affine_inverse`: `[R^T | -R^T t]` (last row kept).
pub fn affine_inverse(m: &Mat4) -> Mat4 {
    let mut out = *m;
    for i in 0..3 {
        for j in 0..3 {
            out[i][j] = m[j][i];
        }
        out[i][3] = -(0..3).map(|k| m[k][i] * m[k][3]).sum::<f64>();
    }
    out
}

fn centre(w2c: &Mat4) -> [f64; 3] {
    let c2w = affine_inverse(w2c);
    [c2w[0][3], c2w[1][3], c2w[2][3]]
}

/// The InputProcessor's intrinsics for an input of `width` x `height` preprocessed by `plan`:
/// `_resize_ixt` for the bound resize and for the patch resize (each a no-op ratio of 1 when
/// the step is skipped), or `_crop_ixt` (the principal point moved by the window's corner)
/// for the crop of the `*_crop` methods.
pub fn processed_intrinsics(k: &Mat3, width: usize, height: usize, plan: &ResizePlan) -> Mat3 {
    let mut k = *k;
    let (mut w, mut h) = (width, height);
    let bounded = plan.bounded_size(width, height);
    let resized = match plan.crop {
        Some(_) => bounded,
        None => (plan.width, plan.height),
    };
    for (nw, nh) in [bounded, resized] {
        let (sx, sy) = (nw as f64 / w as f64, nh as f64 / h as f64);
        for v in &mut k[0] {
            *v *= sx;
        }
        for v in &mut k[1] {
            *v *= sy;
        }
        (w, h) = (nw, nh);
    }
    if let Some(crop) = plan.crop {
        k[0][2] -= crop.left as f64;
        k[1][2] -= crop.top as f64;
    }
    k
}

/// The official `_normalize_extrinsics` on one scene's world-to-camera matrices.
pub fn normalize_extrinsics(extrinsics: &[Mat4]) -> Vec<Mat4> {
    let Some(first) = extrinsics.first() else {
        return Vec::new();
    };
    let transform = affine_inverse(first);
    let mut out: Vec<Mat4> = extrinsics.iter().map(|e| mul4(e, &transform)).collect();
    let mut dists: Vec<f64> = out
        .iter()
        .map(|e| centre(e).iter().map(|v| v * v).sum::<f64>().sqrt())
        .collect();
    dists.sort_by(f64::total_cmp);
    // torch.median: the lower of the two middle values for an even count.
    let median = dists[(dists.len() - 1) / 2].max(0.1);
    for e in &mut out {
        for row in e.iter_mut().take(3) {
            row[3] /= median;
        }
    }
    out
}

/// The official `mat_to_quat` (xyzw, real part non-negative), in f64.
pub fn mat_to_quat(m: &Mat3) -> [f64; 4] {
    let [[m00, m01, m02], [m10, m11, m12], [m20, m21, m22]] = *m;
    let sqrt_pos = |x: f64| if x > 0.0 { x.sqrt() } else { 0.0 };
    let q_abs = [
        sqrt_pos(1.0 + m00 + m11 + m22),
        sqrt_pos(1.0 + m00 - m11 - m22),
        sqrt_pos(1.0 - m00 + m11 - m22),
        sqrt_pos(1.0 - m00 - m11 + m22),
    ];
    // Candidates in (r, i, j, k) order, one per row.
    let candidates = [
        [q_abs[0].powi(2), m21 - m12, m02 - m20, m10 - m01],
        [m21 - m12, q_abs[1].powi(2), m10 + m01, m02 + m20],
        [m02 - m20, m10 + m01, q_abs[2].powi(2), m12 + m21],
        [m10 - m01, m20 + m02, m21 + m12, q_abs[3].powi(2)],
    ];
    // argmax: the first of equal maxima.
    let mut best = 0;
    for i in 1..4 {
        if q_abs[i] > q_abs[best] {
            best = i;
        }
    }
    let denom = 2.0 * q_abs[best].max(0.1);
    let rijk = candidates[best].map(|v| v / denom);
    let xyzw = [rijk[1], rijk[2], rijk[3], rijk[0]];
    if xyzw[3] < 0.0 {
        xyzw.map(|v| -v)
    } else {
        xyzw
    }
}

/// The camera encoder's input for one view: `extri_intri_to_pose_encoding` of the
/// camera-to-world inverse of the normalised extrinsics, for a processed `width` x `height`.
pub fn pose_encoding(
    normalized: &Mat4,
    processed_k: &Mat3,
    width: usize,
    height: usize,
) -> [f32; 9] {
    let c2w = affine_inverse(normalized);
    let q = mat_to_quat(&rotation(&c2w));
    let fov_h = 2.0 * ((height as f64 / 2.0) / processed_k[1][1]).atan();
    let fov_w = 2.0 * ((width as f64 / 2.0) / processed_k[0][0]).atan();
    [
        c2w[0][3], c2w[1][3], c2w[2][3], q[0], q[1], q[2], q[3], fov_h, fov_w,
    ]
    .map(|v| v as f32)
}

/// Singular values of a 3x3 matrix (one-sided Jacobi: the columns are orthogonalised by plane
/// rotations and their norms are the singular values, accurate for the small ones too), any
/// order.
fn singular_values(mut a: Mat3) -> [f64; 3] {
    for _ in 0..64 {
        let mut rotated = false;
        for (p, q) in [(0, 1), (0, 2), (1, 2)] {
            let alpha: f64 = (0..3).map(|i| a[i][p] * a[i][p]).sum();
            let beta: f64 = (0..3).map(|i| a[i][q] * a[i][q]).sum();
            let gamma: f64 = (0..3).map(|i| a[i][p] * a[i][q]).sum();
            if gamma == 0.0 || gamma.abs() <= 1e-15 * (alpha * beta).sqrt() {
                continue;
            }
            rotated = true;
            let zeta = (beta - alpha) / (2.0 * gamma);
            let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
            let t = if zeta == 0.0 { 1.0 } else { t };
            let c = 1.0 / (1.0 + t * t).sqrt();
            let s = c * t;
            for row in a.iter_mut() {
                let (ap, aq) = (row[p], row[q]);
                row[p] = c * ap - s * aq;
                row[q] = s * ap + c * aq;
            }
        }
        if !rotated {
            break;
        }
    }
    [0, 1, 2].map(|j| (0..3).map(|i| a[i][j] * a[i][j]).sum::<f64>().sqrt())
}

/// The scale of evo's Umeyama alignment (`umeyama_alignment(x, y, with_scale=True)`) that maps
/// points `x` onto points `y`: `trace(D S) / sigma_x^2` with `D` the singular values of the
/// covariance and `S` flipping the smallest where `det(U) det(V) < 0`.
pub fn umeyama_scale(x: &[[f64; 3]], y: &[[f64; 3]]) -> Result<f64, Error> {
    let n = x.len();
    if n != y.len() || n == 0 {
        return Err(Error::Input(
            "alignment needs one predicted camera per given camera".into(),
        ));
    }
    let mean = |p: &[[f64; 3]]| -> [f64; 3] {
        let mut m = [0.0; 3];
        for v in p {
            for i in 0..3 {
                m[i] += v[i] / n as f64;
            }
        }
        m
    };
    let (mx, my) = (mean(x), mean(y));
    let sigma_x: f64 = x
        .iter()
        .map(|v| (0..3).map(|i| (v[i] - mx[i]).powi(2)).sum::<f64>())
        .sum::<f64>()
        / n as f64;
    let mut cov = [[0.0; 3]; 3];
    for (a, b) in x.iter().zip(y) {
        for i in 0..3 {
            for j in 0..3 {
                cov[i][j] += (b[i] - my[i]) * (a[j] - mx[j]) / n as f64;
            }
        }
    }
    let mut d = singular_values(cov);
    d.sort_by(|a, b| b.total_cmp(a));
    // det(U) det(V) has the sign of det(cov) (D >= 0); with det(cov) = 0 the smallest
    // singular value is 0 and the flip changes nothing.
    let flip = if det3(&cov) < 0.0 { -1.0 } else { 1.0 };
    let trace = d[0] + d[1] + flip * d[2];
    let scale = trace / sigma_x;
    if !(sigma_x > 1e-12 && d[0] > 1e-12 * sigma_x && scale.is_finite() && scale > 0.0) {
        return Err(Error::Input(format!(
            "cannot align the predicted scale to the given cameras: their centres coincide \
             (or the predicted ones do) over {n} view(s); give cameras at different positions"
        )));
    }
    Ok(scale)
}

/// The official alignment (step 4 of the module docs) of one scene's predictions to the
/// given cameras: returns the scale `s` after dividing every depth map by it and setting
/// every pose to the given extrinsics and the processed intrinsics.
pub fn align_to_known_poses(
    views: &mut [super::Prediction],
    given: &[Mat4],
    processed_k: &[Mat3],
) -> Result<f64, Error> {
    let mut predicted = Vec::with_capacity(views.len());
    for view in views.iter() {
        let pose = view.pose.as_ref().ok_or_else(|| {
            Error::Input("this model has no camera decoder, so it cannot take known poses".into())
        })?;
        let mut w2c = identity4();
        for (i, row) in pose.extrinsics.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                w2c[i][j] = f64::from(*v);
            }
        }
        predicted.push(centre(&w2c));
    }
    let given_centres: Vec<[f64; 3]> = given.iter().map(centre).collect();
    let scale = umeyama_scale(&given_centres, &predicted)?;
    let s = scale as f32;
    for ((view, e), k) in views.iter_mut().zip(given).zip(processed_k) {
        for d in &mut view.depth {
            // Divided, as the official `depth /= scale` (in f32).
            *d /= s;
        }
        let pose = Pose {
            extrinsics: [0, 1, 2].map(|i| e[i].map(|v| v as f32)),
            intrinsics: k.map(|row| row.map(|v| v as f32)),
        };
        view.pose = Some(pose);
    }
    Ok(scale)
}

/// Cameras read from a file, each with the image name it belongs to when the file names one.
#[derive(Debug, Clone)]
pub struct NamedPose {
    /// The image file name the file gives for this camera (`None`: matched by position).
    pub name: Option<String>,
    /// The camera; its intrinsics in pixels of the input image.
    pub pose: KnownPose,
    /// The image size the intrinsics refer to, when the file gives it (`width`, `height`).
    pub size: Option<(usize, usize)>,
}

fn matrix(value: &serde_json::Value, what: &str, at: &str) -> Result<Vec<Vec<f64>>, Error> {
    let bad = || {
        Error::Input(format!(
            "{at}: `{what}` must be a matrix (an array of rows of numbers)"
        ))
    };
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|row| {
            row.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|v| v.as_f64().ok_or_else(bad))
                .collect()
        })
        .collect()
}

/// Cameras from JSON: `{"views": [...]}` or a bare array of views, each with `extrinsics`
/// (or `extrinsics_world_to_camera`, as `da3 --poses-out` writes it: world-to-camera, 3x4 or
/// 4x4) and `intrinsics` (3x3, pixels), optionally `name` and the `width` / `height` the
/// intrinsics refer to.
pub fn parse_poses_json(text: &str, source: &str) -> Result<Vec<NamedPose>, Error> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::Input(format!("{source}: not JSON: {e}")))?;
    let views = match &json {
        serde_json::Value::Array(v) => v,
        serde_json::Value::Object(o) => {
            o.get("views").and_then(|v| v.as_array()).ok_or_else(|| {
                Error::Input(format!(
                    "{source}: expected an array of views or {{\"views\": [...]}}"
                ))
            })?
        }
        _ => {
            return Err(Error::Input(format!(
                "{source}: expected an array of views or {{\"views\": [...]}}"
            )))
        }
    };
    if views.is_empty() {
        return Err(Error::Input(format!("{source}: no views")));
    }
    views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let at = format!("{source}: view {i}");
            let ext = v
                .get("extrinsics")
                .or_else(|| v.get("extrinsics_world_to_camera"))
                .ok_or_else(|| Error::Input(format!("{at}: no `extrinsics`")))?;
            let k = v
                .get("intrinsics")
                .ok_or_else(|| Error::Input(format!("{at}: no `intrinsics`")))?;
            let pose = KnownPose::new(
                &matrix(ext, "extrinsics", &at)?,
                &matrix(k, "intrinsics", &at)?,
            )
            .map_err(|e| Error::Input(format!("{at}: {e}")))?;
            let dim = |key: &str| v.get(key).and_then(|x| x.as_u64()).map(|x| x as usize);
            let size = match (dim("width"), dim("height")) {
                (Some(w), Some(h)) if w > 0 && h > 0 => Some((w, h)),
                (None, None) => None,
                _ => {
                    return Err(Error::Input(format!(
                        "{at}: `width` and `height` must both be positive integers"
                    )))
                }
            };
            Ok(NamedPose {
                name: v.get("name").and_then(|n| n.as_str()).map(str::to_owned),
                pose,
                size,
            })
        })
        .collect()
}

/// [`parse_poses_json`] of a file.
pub fn read_poses_json(path: &Path) -> Result<Vec<NamedPose>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Input(format!("cannot read poses {}: {e}", path.display())))?;
    parse_poses_json(&text, &path.display().to_string())
}

/// Cameras of a COLMAP text model (`cameras.txt` and `images.txt` in `dir`), as the official
/// `colmap` command reads them: images in file order, world-to-camera from the quaternion
/// (w, x, y, z) and translation, intrinsics from `PINHOLE` (fx fy cx cy) or `SIMPLE_PINHOLE`
/// (f cx cy); other models as the official approximation (f = first parameter, principal
/// point at the centre).
pub fn read_colmap_text(dir: &Path) -> Result<Vec<NamedPose>, Error> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .map_err(|e| Error::Input(format!("cannot read {}: {e}", path.display())))
    };
    let cameras_text = read("cameras.txt")?;
    let images_text = read("images.txt")?;
    let mut cameras = std::collections::HashMap::new();
    for (n, line) in cameras_text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("cameras.txt line {}", n + 1);
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 {
            return Err(Error::Input(format!(
                "{}: expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS",
                at()
            )));
        }
        let num = |s: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| Error::Input(format!("{}: `{s}` is not a number", at())))
        };
        let (w, h) = (num(f[2])?, num(f[3])?);
        let params = f[4..]
            .iter()
            .map(|s| num(s))
            .collect::<Result<Vec<_>, _>>()?;
        let (fx, fy, cx, cy) = match (f[1], params.as_slice()) {
            ("PINHOLE", [fx, fy, cx, cy]) => (*fx, *fy, *cx, *cy),
            ("SIMPLE_PINHOLE", [f, cx, cy]) => (*f, *f, *cx, *cy),
            ("PINHOLE" | "SIMPLE_PINHOLE", _) => {
                return Err(Error::Input(format!(
                    "{}: wrong number of {} parameters",
                    at(),
                    f[1]
                )))
            }
            (_, [f, ..]) => (*f, *f, w / 2.0, h / 2.0),
            (_, []) => (1000.0, 1000.0, w / 2.0, h / 2.0),
        };
        let size = (w as usize, h as usize);
        cameras.insert(
            f[0].to_owned(),
            ([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], size),
        );
    }
    let mut poses = Vec::new();
    let mut lines = images_text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with('#'));
    while let Some((n, line)) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("images.txt line {}", n + 1);
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            return Err(Error::Input(format!(
                "{at}: expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME"
            )));
        }
        let v = f[1..8]
            .iter()
            .map(|s| s.parse::<f64>().ok().filter(|v| v.is_finite()))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(|| Error::Input(format!("{at}: a pose value is not a number")))?;
        let (k, size) = cameras
            .get(f[8])
            .ok_or_else(|| Error::Input(format!("{at}: camera {} is not in cameras.txt", f[8])))?;
        // qvec2rotmat of (w, x, y, z), then normalised as a unit quaternion would be.
        let norm = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3]).sqrt();
        if norm < 1e-9 {
            return Err(Error::Input(format!("{at}: zero quaternion")));
        }
        let (w, x, y, z) = (v[0] / norm, v[1] / norm, v[2] / norm, v[3] / norm);
        let r = [
            vec![
                1.0 - 2.0 * y * y - 2.0 * z * z,
                2.0 * x * y - 2.0 * w * z,
                2.0 * z * x + 2.0 * w * y,
                v[4],
            ],
            vec![
                2.0 * x * y + 2.0 * w * z,
                1.0 - 2.0 * x * x - 2.0 * z * z,
                2.0 * y * z - 2.0 * w * x,
                v[5],
            ],
            vec![
                2.0 * z * x - 2.0 * w * y,
                2.0 * y * z + 2.0 * w * x,
                1.0 - 2.0 * x * x - 2.0 * y * y,
                v[6],
            ],
        ];
        let kk: Vec<Vec<f64>> = k.iter().map(|row| row.to_vec()).collect();
        let pose = KnownPose::new(&r, &kk).map_err(|e| Error::Input(format!("{at}: {e}")))?;
        poses.push(NamedPose {
            name: Some(f[9..].join(" ")),
            pose,
            size: Some(*size),
        });
        // The second line of an image: its 2D points (ignored).
        lines.next();
    }
    if poses.is_empty() {
        return Err(Error::Input(format!(
            "{}: no images",
            dir.join("images.txt").display()
        )));
    }
    Ok(poses)
}

/// The cameras for `count` views: by name where every file entry has one and `names` are
/// given (each view's name must be found), otherwise by position (the file must list every
/// view). Intrinsics given for another image size (`width`, `height` in the file) are
/// rescaled to the view's input size `sizes[i]`.
pub fn match_views(
    poses: &[NamedPose],
    names: &[String],
    sizes: &[(usize, usize)],
) -> Result<Vec<KnownPose>, Error> {
    let count = sizes.len();
    let by_name = !names.is_empty() && poses.iter().all(|p| p.name.is_some());
    let chosen: Vec<&NamedPose> = if by_name {
        names
            .iter()
            .map(|n| {
                let base = Path::new(n)
                    .file_name()
                    .map(|b| b.to_string_lossy().into_owned());
                poses
                    .iter()
                    .find(|p| {
                        let pn = p.name.as_deref().unwrap_or_default();
                        pn == n
                            || Some(pn.to_owned()) == base
                            || Path::new(pn)
                                .file_name()
                                .map(|b| b.to_string_lossy().into_owned())
                                == base
                    })
                    .ok_or_else(|| Error::Input(format!("the poses name no camera for `{n}`")))
            })
            .collect::<Result<_, _>>()?
    } else {
        if poses.len() != count {
            return Err(Error::Input(format!(
                "the poses list {} camera(s) for {count} view(s); list every view",
                poses.len()
            )));
        }
        poses.iter().collect()
    };
    Ok(chosen
        .iter()
        .zip(sizes)
        .map(|(p, &(w, h))| {
            let mut pose = p.pose;
            if let Some((fw, fh)) = p.size {
                if (fw, fh) != (w, h) {
                    let (sx, sy) = (w as f64 / fw as f64, h as f64 / fh as f64);
                    for v in &mut pose.intrinsics[0] {
                        *v *= sx;
                    }
                    for v in &mut pose.intrinsics[1] {
                        *v *= sy;
                    }
                }
            }
            pose
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The official `_resize_ixt` then `_crop_ixt` of `upper_bound_crop`: 640x427 to 504x336
    /// (exactly: 427 * 504 / 640 = 336.26 rounds to 336), no crop; 640x437 to 504x344,
    /// cropped to 504x336 from row (344 - 336) // 2 = 4.
    #[test]
    fn crop_methods_move_the_principal_point() {
        use crate::da3::preprocess::{plan_resize_by, ResizeMethod};
        let k = [[600.0, 0.0, 320.0], [0.0, 610.0, 218.5], [0.0, 0.0, 1.0]];
        let plan = plan_resize_by(640, 437, 504, ResizeMethod::UpperBoundCrop).unwrap();
        assert_eq!(plan.bounded_size(640, 437), (504, 344));
        assert_eq!((plan.width, plan.height), (504, 336));
        let out = processed_intrinsics(&k, 640, 437, &plan);
        let (sx, sy) = (504.0 / 640.0, 344.0 / 437.0);
        assert_eq!(out[0], [600.0 * sx, 0.0, 320.0 * sx]);
        assert_eq!(out[1], [0.0, 610.0 * sy, 218.5 * sy - 4.0]);
        // The resize methods scale to the final size instead.
        let plan = plan_resize_by(640, 437, 504, ResizeMethod::UpperBoundResize).unwrap();
        let out = processed_intrinsics(&k, 640, 437, &plan);
        assert_eq!((plan.width, plan.height), (504, 350));
        assert!((out[1][1] - 610.0 * sy * (350.0 / 344.0)).abs() < 1e-9);
    }

    fn rot_y(deg: f64) -> Mat3 {
        let a = deg.to_radians();
        [
            [a.cos(), 0.0, a.sin()],
            [0.0, 1.0, 0.0],
            [-a.sin(), 0.0, a.cos()],
        ]
    }

    #[test]
    fn quaternions_round_trip_through_the_rotation() {
        for deg in [0.0, 10.0, 90.0, 179.0, -120.0] {
            let r = rot_y(deg);
            let q = mat_to_quat(&r);
            assert!(q[3] >= 0.0);
            let back = crate::geometry::rotation::matrix_of_xyzw(q);
            for a in 0..3 {
                for b in 0..3 {
                    assert!((back[a][b] - r[a][b]).abs() < 1e-12, "{deg}");
                }
            }
        }
    }

    #[test]
    fn umeyama_recovers_a_similarity_scale() {
        // y = 2.5 R x + t for a rotation R: the scale is 2.5 (3 and more views), and for two
        // views the baseline ratio.
        let r = rot_y(30.0);
        let x = [
            [0.0, 0.0, 0.0],
            [1.0, 0.2, -0.3],
            [0.4, 1.1, 0.5],
            [-0.7, 0.3, 0.9],
        ];
        let y: Vec<[f64; 3]> = x
            .iter()
            .map(|p| {
                let mut q = [0.5, -1.0, 2.0];
                for i in 0..3 {
                    q[i] += 2.5 * (0..3).map(|j| r[i][j] * p[j]).sum::<f64>();
                }
                q
            })
            .collect();
        for n in [2, 3, 4] {
            let s = umeyama_scale(&x[..n], &y[..n]).unwrap();
            assert!((s - 2.5).abs() < 1e-9, "{n} views: {s}");
        }
        assert!(umeyama_scale(&x[..1], &y[..1]).is_err());
        assert!(umeyama_scale(&[x[1], x[1]], &y[..2]).is_err());
    }

    #[test]
    fn bad_cameras_are_refused_with_reasons() {
        let k = vec![
            vec![500.0, 0.0, 320.0],
            vec![0.0, 500.0, 240.0],
            vec![0.0, 0.0, 1.0],
        ];
        let e = vec![
            vec![2.0, 0.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0, 0.0],
            vec![0.0, 0.0, 1.0, 0.0],
        ];
        let err = KnownPose::new(&e, &k).unwrap_err().to_string();
        assert!(err.contains("not a rotation"), "{err}");
        let e = vec![vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 1.0, 0.0, 0.0]];
        assert!(KnownPose::new(&e, &k)
            .unwrap_err()
            .to_string()
            .contains("3x4 or 4x4"));
        let json = r#"{"views": [{"extrinsics": [[1,0,0,0],[0,1,0,0],[0,0,1,0]]}]}"#;
        let err = parse_poses_json(json, "p.json").unwrap_err().to_string();
        assert!(err.contains("no `intrinsics`"), "{err}");
        assert!(parse_poses_json("[]", "p.json").is_err());
        assert!(parse_poses_json("{", "p.json")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
    }
}
