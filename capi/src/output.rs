//! What a run returns: per-view maps and cameras, and the exports.

use crate::{borrow, check_out, file_path, free_handle, guard, write_optional, write_out};
use crate::{Da3Status, Failure};
use std::ffi::c_char;

/// What a run returns: one prediction per input image, in input order, and what the scene
/// shares. Opaque.
///
/// Thread safety: an output is never changed after it is made; the functions that take a
/// `const da3_output*` may run on any thread at the same time.
pub struct Da3Output {
    output: da3::Output,
}

impl Da3Output {
    pub(crate) fn new(output: da3::Output) -> Da3Output {
        Da3Output { output }
    }

    fn view(&self, view: usize) -> Result<&da3::Prediction, Failure> {
        self.output.views.get(view).ok_or_else(|| {
            Failure::invalid(format!(
                "view {view} of an output of {} view(s) (the first is 0)",
                self.output.views.len()
            ))
        })
    }

    /// The views an export covers: the one asked for, or all for `DA3_ALL_VIEWS`.
    fn views(&self, view: usize) -> Result<&[da3::Prediction], Failure> {
        if view == DA3_ALL_VIEWS {
            Ok(&self.output.views)
        } else {
            self.view(view).map(std::slice::from_ref)
        }
    }
}

/// A scene's 3D Gaussians (`da3_output_gaussians`): `count` of them, one per pixel of every
/// view (views in order, rows top to bottom), as arrays owned by the output.
#[repr(C)]
pub struct Da3Gaussians {
    /// How many.
    pub count: usize,
    /// Spherical-harmonic coefficients per colour channel ((degree + 1)^2: 9 for DA3-GIANT).
    pub sh_coefficients: usize,
    /// `count * 3` floats: the centres, in the world frame of the views' poses.
    pub means: *const f32,
    /// `count * 3` floats: standard deviations along each Gaussian's axes.
    pub scales: *const f32,
    /// `count * 4` floats: orientations as quaternions, w first.
    pub rotations: *const f32,
    /// `count * 3 * sh_coefficients` floats: per Gaussian, red's coefficients, then green's,
    /// then blue's.
    pub harmonics: *const f32,
    /// `count` floats: opacities in 0..1.
    pub opacities: *const f32,
}

/// For the exports that take a view: every view of the scene, in one world frame.
// Written so because cbindgen drops `usize::MAX` and writes `!0usize` as `~0`, an `int`: the
// header gets `~(size_t)0`.
#[allow(clippy::unnecessary_cast)]
pub const DA3_ALL_VIEWS: usize = !(0 as usize);

/// A colour map for `da3_output_save_png`: one of the `DA3_COLORMAP_*` values.
pub type Da3Colormap = u32;
/// Google's Turbo rainbow map, near = red.
pub const DA3_COLORMAP_TURBO: Da3Colormap = 0;
/// Grey levels, near = white.
pub const DA3_COLORMAP_GRAY: Da3Colormap = 1;
/// matplotlib's inferno, near = yellow.
pub const DA3_COLORMAP_INFERNO: Da3Colormap = 2;
/// matplotlib's viridis, near = yellow.
pub const DA3_COLORMAP_VIRIDIS: Da3Colormap = 3;

/// How the 3D exports (PLY, glb, COLMAP) are made. Start from
/// `da3_export_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Da3ExportOptions {
    /// Most points in a PLY or glb, evenly subsampled beyond; 0: no cap. COLMAP models are
    /// never capped. Default 1000000, the official one.
    pub max_points: usize,
    /// Confidence percentile below which points are dropped, 0 to 100. Default 40, the
    /// official one.
    pub confidence_percentile: f64,
    /// For models that predict no camera (mono, metric): the horizontal field of view in
    /// degrees of the pinhole camera to assume. 0: none, and such a model has no 3D export
    /// (`DA3_STATUS_NOT_AVAILABLE`).
    pub assumed_fov: f32,
}

/// The official exports' defaults: at most 1000000 points, confidence percentile 40, no
/// assumed camera.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn da3_export_options_default() -> Da3ExportOptions {
    let defaults = da3::export::ExportOptions::default();
    Da3ExportOptions {
        max_points: defaults.max_points.unwrap_or(0),
        confidence_percentile: defaults.confidence_percentile,
        assumed_fov: defaults.assumed_fov.unwrap_or(0.0),
    }
}

/// The number of views of `output`; 0 for NULL.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output.
#[no_mangle]
pub unsafe extern "C" fn da3_output_views(output: *const Da3Output) -> usize {
    // SAFETY: the caller guarantees a live output or NULL.
    unsafe { output.as_ref() }.map_or(0, |output| output.output.views.len())
}

/// The reference view (whose camera is the world frame of the poses) into `*view`.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `view` NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_reference(
    output: *const Da3Output,
    view: *mut usize,
) -> Da3Status {
    guard(|| {
        check_out(view, "view")?;
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(view, output.output.reference) };
        Ok(())
    })
}

/// Hands out a map of `view` (`width * height` floats, row-major, rows top to bottom), chosen
/// by `pick`; `NotAvailable` with `missing` when the model has none.
///
/// # Safety
/// As the accessors that call it: `output` NULL or live, the out-pointers NULL or writable.
unsafe fn map(
    output: *const Da3Output,
    view: usize,
    data: *mut *const f32,
    width: *mut usize,
    height: *mut usize,
    pick: fn(&da3::Prediction) -> Option<&[f32]>,
    missing: &str,
) -> Da3Status {
    guard(|| {
        check_out(data, "data")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(data, std::ptr::null()) };
        // SAFETY: the caller guarantees a live output or NULL.
        let prediction = unsafe { borrow(output, "output") }?.view(view)?;
        let values =
            pick(prediction).ok_or_else(|| Failure::new(Da3Status::NotAvailable, missing))?;
        // SAFETY: `data` is checked non-null; the caller guarantees every out-pointer given
        // is valid for a write.
        unsafe {
            write_out(data, values.as_ptr());
            write_optional(width, prediction.width);
            write_optional(height, prediction.height);
        }
        Ok(())
    })
}

/// The depth of `view`: `*data` points to `width * height` floats, row-major, rows top to
/// bottom, at the processed size (`*width` x `*height`), valid until the output is freed.
/// Relative depth for any-view models, metres for metric ones. `width` and `height` may be
/// NULL when not wanted.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `data` NULL or valid for writing a pointer;
/// `width` and `height` NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_depth(
    output: *const Da3Output,
    view: usize,
    data: *mut *const f32,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    // SAFETY: the caller's guarantees are the ones `map` needs.
    unsafe {
        map(
            output,
            view,
            data,
            width,
            height,
            |p| Some(p.depth.as_slice()),
            "",
        )
    }
}

/// The depth confidence of `view`, laid out as `da3_output_depth`'s; `DA3_STATUS_NOT_AVAILABLE`
/// for a model without a confidence output.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// As `da3_output_depth`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_confidence(
    output: *const Da3Output,
    view: usize,
    data: *mut *const f32,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    let pick: fn(&da3::Prediction) -> Option<&[f32]> = |p| p.confidence.as_deref();
    let missing = "this model has no confidence output";
    // SAFETY: the caller's guarantees are the ones `map` needs.
    unsafe { map(output, view, data, width, height, pick, missing) }
}

/// The sky probability of `view`, laid out as `da3_output_depth`'s; `DA3_STATUS_NOT_AVAILABLE`
/// for a model without a sky head (only mono and metric models have one).
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// As `da3_output_depth`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_sky(
    output: *const Da3Output,
    view: usize,
    data: *mut *const f32,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    let pick: fn(&da3::Prediction) -> Option<&[f32]> = |p| p.sky.as_deref();
    let missing = "this model has no sky head (only mono and metric models have one)";
    // SAFETY: the caller's guarantees are the ones `map` needs.
    unsafe { map(output, view, data, width, height, pick, missing) }
}

/// The processed image of `view` (what the model saw, and the colours of the 3D exports):
/// `*rgb` points to `width * height * 3` bytes of interleaved RGB, valid until the output is
/// freed. `width` and `height` may be NULL when not wanted.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `rgb` NULL or valid for writing a pointer; `width`
/// and `height` NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_image(
    output: *const Da3Output,
    view: usize,
    rgb: *mut *const u8,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    guard(|| {
        check_out(rgb, "rgb")?;
        // SAFETY: the caller guarantees a live output or NULL.
        let image = &unsafe { borrow(output, "output") }?.view(view)?.image;
        // SAFETY: `rgb` is checked non-null; the caller guarantees every out-pointer given is
        // valid for a write.
        unsafe {
            write_out(rgb, image.data.as_ptr());
            write_optional(width, image.width);
            write_optional(height, image.height);
        }
        Ok(())
    })
}

/// The size of the input image of `view` (the maps are at the processed size; scale by
/// `input / processed` to reach input pixels). Either pointer may be NULL.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `width` and `height` NULL or valid for writing a
/// `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_input_size(
    output: *const Da3Output,
    view: usize,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let (input_width, input_height) =
            unsafe { borrow(output, "output") }?.view(view)?.input_size;
        // SAFETY: the caller guarantees each out-pointer is NULL or valid for a write.
        unsafe {
            write_optional(width, input_width);
            write_optional(height, input_height);
        }
        Ok(())
    })
}

/// The camera of `view`: `extrinsics` receives 12 floats, the 3x4 world-to-camera matrix
/// `[R | t]` rows first, in the reference view's frame; `intrinsics` 9 floats, the 3x3
/// pinhole matrix rows first, in pixels of the processed size. Either may be NULL when not
/// wanted. `DA3_STATUS_NOT_AVAILABLE` for a model that predicts no camera (mono, metric).
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `extrinsics` NULL or valid for writing 12 floats;
/// `intrinsics` NULL or valid for writing 9 floats.
#[no_mangle]
pub unsafe extern "C" fn da3_output_pose(
    output: *const Da3Output,
    view: usize,
    extrinsics: *mut f32,
    intrinsics: *mut f32,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let prediction = unsafe { borrow(output, "output") }?.view(view)?;
        let pose = prediction.pose.ok_or_else(|| {
            Failure::new(
                Da3Status::NotAvailable,
                "this model predicts no camera (only the any-view models with a camera \
                 decoder do)",
            )
        })?;
        if !extrinsics.is_null() {
            let values = pose.extrinsics.as_flattened();
            // SAFETY: non-null, and the caller guarantees room for 12 floats; the source is
            // this library's own array, which cannot overlap the caller's.
            unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), extrinsics, values.len()) };
        }
        if !intrinsics.is_null() {
            let values = pose.intrinsics.as_flattened();
            // SAFETY: non-null, and the caller guarantees room for 9 floats; no overlap.
            unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), intrinsics, values.len()) };
        }
        Ok(())
    })
}

/// With known cameras: the scale the predicted depth was divided by to reach their units,
/// into `*scale`; `DA3_STATUS_NOT_AVAILABLE` for a run without known cameras.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `scale` NULL or valid for writing a double.
#[no_mangle]
pub unsafe extern "C" fn da3_output_pose_scale(
    output: *const Da3Output,
    scale: *mut f64,
) -> Da3Status {
    guard(|| {
        check_out(scale, "scale")?;
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        let value = output
            .output
            .pose_scale
            .ok_or_else(|| Failure::new(Da3Status::NotAvailable, "the run had no known cameras"))?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(scale, value) };
        Ok(())
    })
}

/// The export options of `options`, NULL meaning the defaults.
///
/// # Safety
/// `options` must be NULL or valid export options.
unsafe fn export_options(
    options: *const Da3ExportOptions,
) -> Result<da3::export::ExportOptions, Failure> {
    let options = match options.is_null() {
        true => da3_export_options_default(),
        // SAFETY: non-null, and the caller guarantees valid export options.
        false => *unsafe { borrow(options, "options") }?,
    };
    if !(0.0..=100.0).contains(&options.confidence_percentile) {
        return Err(Failure::invalid(format!(
            "options.confidence_percentile {} is not within 0 to 100",
            options.confidence_percentile
        )));
    }
    if !(options.assumed_fov == 0.0 || (options.assumed_fov > 0.0 && options.assumed_fov < 180.0)) {
        return Err(Failure::invalid(format!(
            "options.assumed_fov {} is not 0 (none) or a field of view between 0 and 180 degrees",
            options.assumed_fov
        )));
    }
    Ok(da3::export::ExportOptions {
        max_points: (options.max_points != 0).then_some(options.max_points),
        confidence_percentile: options.confidence_percentile,
        assumed_fov: (options.assumed_fov != 0.0).then_some(options.assumed_fov),
        ..da3::export::ExportOptions::default()
    })
}

/// `NotAvailable` when a view of `views` has no camera and `options` assumes none: the 3D
/// exports need one.
fn check_cameras(
    views: &[da3::Prediction],
    options: &da3::export::ExportOptions,
) -> Result<(), Failure> {
    if options.assumed_fov.is_none() && views.iter().any(|view| view.pose.is_none()) {
        return Err(Failure::new(
            Da3Status::NotAvailable,
            "a 3D export needs a camera, and this model predicts none (mono/metric): set \
             da3_export_options.assumed_fov to assume a pinhole camera",
        ));
    }
    Ok(())
}

/// What a 3D export covers: the whole scene or one view.
enum Selection<'a> {
    Scene(&'a da3::Output),
    View(&'a da3::Prediction),
}

type Export3d =
    fn(Selection<'_>, &std::path::Path, &da3::export::ExportOptions) -> Result<(), da3::Error>;

/// A 3D export of what `view` selects, with the path and options checked.
///
/// # Safety
/// `output` NULL or a live output; `path` NULL or a NUL-terminated string; `options` NULL or
/// valid export options.
unsafe fn export_3d(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
    options: *const Da3ExportOptions,
    write: Export3d,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        // SAFETY: the caller guarantees NULL or valid export options.
        let options = unsafe { export_options(options) }?;
        check_cameras(output.views(view)?, &options)?;
        let selection = match view {
            DA3_ALL_VIEWS => Selection::Scene(&output.output),
            view => Selection::View(output.view(view)?),
        };
        write(selection, &file, &options)?;
        Ok(())
    })
}

/// Writes the points of `view` (or of every view in one world frame, for `DA3_ALL_VIEWS`) as
/// a binary PLY at `path`, coloured by the processed images and filtered by confidence as
/// `options` say (NULL: the defaults). The file is written whole or not at all.
///
/// Statuses: `DA3_STATUS_NOT_AVAILABLE` (no camera and no `assumed_fov`), `DA3_STATUS_IO`,
/// `DA3_STATUS_INVALID_ARGUMENT`.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string; `options`
/// NULL or valid export options.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_ply(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
    options: *const Da3ExportOptions,
) -> Da3Status {
    // SAFETY: the caller's guarantees are the ones `export_3d` needs.
    unsafe {
        export_3d(
            output,
            view,
            path,
            options,
            |selection, path, options| match selection {
                Selection::Scene(scene) => scene.save_ply(path, options),
                Selection::View(view) => view.save_ply(path, options),
            },
        )
    }
}

/// Writes `view` (or the whole scene, for `DA3_ALL_VIEWS`) as glb (glTF 2.0) at `path`: the
/// points and a frustum per camera, as `da3_output_save_ply`.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// As `da3_output_save_ply`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_glb(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
    options: *const Da3ExportOptions,
) -> Da3Status {
    // SAFETY: the caller's guarantees are the ones `export_3d` needs.
    unsafe {
        export_3d(
            output,
            view,
            path,
            options,
            |selection, path, options| match selection {
                Selection::Scene(scene) => scene.save_glb(path, options),
                Selection::View(view) => view.save_glb(path, options),
            },
        )
    }
}

/// Writes `view` (or the whole scene, for `DA3_ALL_VIEWS`) as a COLMAP sparse model, text and
/// binary, into the folder `dir` (created if missing; its parent must exist); cameras at the
/// input images' sizes.
///
/// Thread safety: any thread, several at once (to different folders).
///
/// # Safety
/// As `da3_output_save_ply`, `dir` for `path`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_colmap(
    output: *const Da3Output,
    view: usize,
    dir: *const c_char,
    options: *const Da3ExportOptions,
) -> Da3Status {
    // SAFETY: the caller's guarantees are the ones `export_3d` needs.
    unsafe {
        export_3d(
            output,
            view,
            dir,
            options,
            |selection, path, options| match selection {
                Selection::Scene(scene) => scene.save_colmap(path, options),
                Selection::View(view) => view.save_colmap(path, options),
            },
        )
    }
}

/// Writes depth, confidence, extrinsics and intrinsics of `view` (or of every view, for
/// `DA3_ALL_VIEWS`) as the official `mini_npz` archive at `path`.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_npz(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        match view {
            DA3_ALL_VIEWS => output.output.save_npz(file)?,
            view => output.view(view)?.save_npz(file)?,
        }
        Ok(())
    })
}

/// The scene's 3D Gaussians into `*gaussians` (arrays valid until the output is freed);
/// `DA3_STATUS_NOT_AVAILABLE` when the run did not compute them (`da3_run_options.gaussians`).
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `output` must be NULL or a live output; `gaussians` NULL or valid for writing a
/// `da3_gaussians`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_gaussians(
    output: *const Da3Output,
    gaussians: *mut Da3Gaussians,
) -> Da3Status {
    guard(|| {
        check_out(gaussians, "gaussians")?;
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        let g = output.output.gaussians.as_ref().ok_or_else(|| {
            Failure::new(
                Da3Status::NotAvailable,
                "no 3D Gaussians: the run did not ask for them (da3_run_options.gaussians)",
            )
        })?;
        let view = Da3Gaussians {
            count: g.len(),
            sh_coefficients: g.sh_coefficients,
            means: g.means.as_ptr().cast(),
            scales: g.scales.as_ptr().cast(),
            rotations: g.rotations.as_ptr().cast(),
            harmonics: g.harmonics.as_ptr(),
            opacities: g.opacities.as_ptr(),
        };
        // SAFETY: checked non-null; the caller guarantees it is valid for a write.
        unsafe { write_out(gaussians, view) };
        Ok(())
    })
}

/// Writes the scene's 3D Gaussians as a 3DGS PLY file at `path` (the official export's
/// pruning: image borders, the deepest 10 % of each view) and, where `written` is not NULL,
/// how many it wrote. `DA3_STATUS_NOT_AVAILABLE` when the run did not compute them.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string; `written`
/// NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_gs_ply(
    output: *const Da3Output,
    path: *const c_char,
    written: *mut usize,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        if output.output.gaussians.is_none() {
            return Err(Failure::new(
                Da3Status::NotAvailable,
                "no 3D Gaussians: the run did not ask for them (da3_run_options.gaussians)",
            ));
        }
        let count = output
            .output
            .save_gaussian_ply(file, &da3::export::GaussianPlyOptions::default())?;
        // SAFETY: the caller guarantees NULL or valid for a write.
        unsafe { write_optional(written, count) };
        Ok(())
    })
}

/// Writes the scene's cameras as JSON at `path`: `reference`, `ref_view_strategy` and
/// `views`, one entry per view (`index`, `name`, `width`, `height`, `intrinsics`,
/// `extrinsics_world_to_camera`, `reference`); with known cameras also `pose_scale`.
/// `DA3_STATUS_NOT_AVAILABLE` for a model that predicts no camera.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_poses_json(
    output: *const Da3Output,
    path: *const c_char,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let output = unsafe { borrow(output, "output") }?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        check_cameras(&output.output.views, &da3::export::ExportOptions::default())?;
        output.output.save_poses_json(file)?;
        Ok(())
    })
}

/// Writes the depth of `view` as an 8-bit PNG at `path`, scaled to its range (near = bright
/// or warm) through `colormap` (`DA3_COLORMAP_*`).
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_png(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
    colormap: Da3Colormap,
) -> Da3Status {
    guard(|| {
        let colormap = match colormap {
            DA3_COLORMAP_TURBO => da3::Colormap::Turbo,
            DA3_COLORMAP_GRAY => da3::Colormap::Gray,
            DA3_COLORMAP_INFERNO => da3::Colormap::Inferno,
            DA3_COLORMAP_VIRIDIS => da3::Colormap::Viridis,
            other => {
                return Err(Failure::invalid(format!(
                    "colormap {other} is none of the DA3_COLORMAP_* values"
                )))
            }
        };
        // SAFETY: the caller guarantees a live output or NULL.
        let prediction = unsafe { borrow(output, "output") }?.view(view)?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        prediction.save_png(file, colormap)?;
        Ok(())
    })
}

/// Writes the depth of `view` as a 16-bit greyscale PNG at `path`, scaled to its range (near
/// = bright), the range in a text chunk.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_png16(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let prediction = unsafe { borrow(output, "output") }?.view(view)?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        prediction.save_png16(file)?;
        Ok(())
    })
}

/// Writes the depth of `view` as PFM (float32, exact values) at `path`.
///
/// Thread safety: any thread, several at once (to different files).
///
/// # Safety
/// `output` must be NULL or a live output; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn da3_output_save_pfm(
    output: *const Da3Output,
    view: usize,
    path: *const c_char,
) -> Da3Status {
    guard(|| {
        // SAFETY: the caller guarantees a live output or NULL.
        let prediction = unsafe { borrow(output, "output") }?.view(view)?;
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        prediction.save_pfm(file)?;
        Ok(())
    })
}

/// Frees an output; NULL is a no-op. The pointers its accessors handed out die with it.
///
/// Thread safety: any thread, once no other call is using this output.
///
/// # Safety
/// `output` must be NULL or an output from `da3_session_run` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn da3_output_free(output: *mut Da3Output) {
    // SAFETY: the caller guarantees a live output or NULL.
    unsafe { free_handle(output) }
}
