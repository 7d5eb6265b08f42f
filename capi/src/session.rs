//! Sessions and runs: `da3_session_new`, `da3_session_run`, `da3_session_free`.

use crate::image::Da3Image;
use crate::model::Da3Model;
use crate::output::Da3Output;
use crate::{borrow, borrow_mut, check_out, guard, utf8, write_out, Da3Status, Failure};
use std::cell::Cell;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one computation at a time needs (graphs per resolution, their memory, the planner).
/// Opaque.
///
/// Thread safety: a session belongs to the thread that created it. Every call with a
/// session, `da3_session_free` included, must come from that thread (others get
/// `DA3_STATUS_WRONG_THREAD`); make one session per thread, all from one shared model.
pub struct Da3Session {
    session: da3::Session,
    /// The thread that created the session ([`current_thread`]): `da3::Session` is `!Send`,
    /// so no other may use or drop it.
    owner: u64,
}

/// A number for the calling thread, never reused while the process lives. Not
/// `std::thread::current().id()`: on a thread C started, that allocates a handle the main
/// thread never frees, which valgrind reports as lost.
fn current_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static THIS_THREAD: Cell<u64> = const { Cell::new(0) };
    }
    THIS_THREAD.with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    })
}

impl Da3Session {
    fn check_thread(&self) -> Result<(), Failure> {
        if current_thread() == self.owner {
            Ok(())
        } else {
            Err(Failure::new(
                Da3Status::WrongThread,
                "this session belongs to another thread: use (and free) a session only on the \
                 thread that created it, one session per thread",
            ))
        }
    }
}

/// How the reference view of a scene (the one whose camera is the world frame of the
/// poses) is chosen: one of the `DA3_REFERENCE_*` values.
pub type Da3Reference = u32;

/// The official default: the view whose token statistics are closest to the middle of their
/// ranges over the views (`saddle_balanced`). Applies to scenes of three views or more;
/// below that, view 0.
pub const DA3_REFERENCE_SADDLE_BALANCED: Da3Reference = 0;
/// View 0.
pub const DA3_REFERENCE_FIRST: Da3Reference = 1;
/// The middle view (`views / 2`).
pub const DA3_REFERENCE_MIDDLE: Da3Reference = 2;
/// The view with the widest range of similarities to the others (`saddle_sim_range`).
pub const DA3_REFERENCE_SADDLE_SIM_RANGE: Da3Reference = 3;
/// The view `da3_run_options.reference_view`, for any number of views.
pub const DA3_REFERENCE_VIEW: Da3Reference = 4;

/// How to run. Start from `da3_run_options_default()`; a zeroed struct also means the
/// defaults. Every pointer is read during `da3_session_run` only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Da3RunOptions {
    /// Longest side the images are processed at (sides become multiples of 14); 0: the
    /// model's (`da3_load_options.process_res`).
    pub process_res: usize,
    /// How the reference view is chosen (`DA3_REFERENCE_*`).
    pub reference: Da3Reference,
    /// The reference view when `reference` is `DA3_REFERENCE_VIEW`.
    pub reference_view: usize,
    /// Known cameras, or NULL: `views * 12` floats, per view the 3x4 world-to-camera matrix
    /// `[R | t]`, rows first. Needs `intrinsics` too and a model loaded with
    /// `camera_encoder`; the output's depth is then in the units of these cameras and its
    /// poses are these (view 0 the reference).
    pub extrinsics: *const f32,
    /// With `extrinsics`: `views * 9` floats, per view the 3x3 intrinsics in pixels of that
    /// input image, rows first.
    pub intrinsics: *const f32,
    /// The views' names, or NULL (`image0.png`, `image1.png`, ...): `views` NUL-terminated
    /// UTF-8 strings, used by the COLMAP and `poses.json` exports.
    pub names: *const *const c_char,
    /// Also the scene's 3D Gaussians (`da3_output_gaussians`), for a model loaded with its
    /// Gaussian head (`da3_load_options.gaussians`); not with known cameras.
    pub gaussians: bool,
}

/// The default run options: the model's process resolution, the official reference-view
/// strategy, no known cameras, default names, no Gaussians.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn da3_run_options_default() -> Da3RunOptions {
    Da3RunOptions {
        process_res: 0,
        reference: DA3_REFERENCE_SADDLE_BALANCED,
        reference_view: 0,
        extrinsics: std::ptr::null(),
        intrinsics: std::ptr::null(),
        names: std::ptr::null(),
        gaussians: false,
    }
}

/// Makes a session of `model` into `*session`, for the calling thread only; the caller
/// frees it with `da3_session_free` on this thread. It keeps the model's weights alive, so
/// the model may be freed first. On failure `*session` is NULL.
///
/// Thread safety: any thread, several at once with one model.
///
/// # Safety
/// `model` must be NULL or a live model; `session` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_session_new(
    model: *const Da3Model,
    session: *mut *mut Da3Session,
) -> Da3Status {
    guard(|| {
        check_out(session, "session")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(session, std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a live model or NULL.
        let model = unsafe { borrow(model, "model") }?;
        let handle = Box::into_raw(Box::new(Da3Session {
            session: model.model.session()?,
            owner: current_thread(),
        }));
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(session, handle) };
        Ok(())
    })
}

/// Frees a session on the thread that created it; NULL is a no-op (`DA3_STATUS_OK`). From
/// another thread it frees nothing and returns `DA3_STATUS_WRONG_THREAD`.
///
/// Thread safety: only the session's thread.
///
/// # Safety
/// `session` must be NULL or a session from `da3_session_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn da3_session_free(session: *mut Da3Session) -> Da3Status {
    guard(|| {
        if session.is_null() {
            return Ok(());
        }
        // SAFETY: non-null, and the caller guarantees a live session no other call uses.
        unsafe { borrow(session, "session") }?.check_thread()?;
        // SAFETY: a live session from `Box::into_raw`, freed once, on its own thread.
        drop(unsafe { Box::from_raw(session) });
        Ok(())
    })
}

/// Predicts depth (and confidence, camera pose, where the model has them) for `views`
/// images computed as one scene (one image is a scene of one view), into `*output`, which the
/// caller frees with `da3_output_free`. `options` NULL means the defaults. The images may be
/// freed as soon as this returns. On failure `*output` is NULL.
///
/// Statuses: `DA3_STATUS_INVALID_ARGUMENT` (no images, a NULL image, options that do not fit
/// the scene, known cameras for a model loaded without `camera_encoder`, ...),
/// `DA3_STATUS_IMAGE`, `DA3_STATUS_DEVICE`, `DA3_STATUS_WRONG_THREAD`.
///
/// Thread safety: only the session's thread; sessions of one model on different threads
/// may run at the same time.
///
/// # Safety
/// `session` must be NULL or a live session; `images` NULL or valid for reading `views`
/// pointers, each NULL or a live image; `options` NULL or valid run options whose non-NULL
/// pointers are valid for the counts their fields state; `output` NULL or valid for writing
/// a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_session_run(
    session: *mut Da3Session,
    images: *const *const Da3Image,
    views: usize,
    options: *const Da3RunOptions,
    output: *mut *mut Da3Output,
) -> Da3Status {
    guard(|| {
        check_out(output, "output")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(output, std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a live session that no other call uses meanwhile.
        let session = unsafe { borrow_mut(session, "session") }?;
        session.check_thread()?;
        if views == 0 {
            return Err(Failure::invalid(
                "a run needs at least one image (views is 0)",
            ));
        }
        if images.is_null() {
            return Err(Failure::null("images"));
        }
        // SAFETY: non-null, and the caller guarantees `views` readable pointers.
        let handles = unsafe { std::slice::from_raw_parts(images, views) };
        let images = handles
            .iter()
            .enumerate()
            .map(|(i, &image)| {
                // SAFETY: the caller guarantees each pointer is NULL or a live image.
                unsafe { borrow(image, &format!("images[{i}]")) }.map(|image| image.image.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = match options.is_null() {
            true => da3_run_options_default(),
            // SAFETY: non-null, and the caller guarantees valid run options.
            false => *unsafe { borrow(options, "options") }?,
        };
        // SAFETY: the caller guarantees the options' pointers are valid for `views` views.
        let poses = unsafe { known_poses(&options, views) }?;
        // SAFETY: as above.
        let names = unsafe { names(&options, views) }?;
        let mut request = da3::Request::new(&images)
            .reference(reference(&options)?)
            .gaussians(options.gaussians);
        if options.process_res != 0 {
            request = request.process_res(options.process_res);
        }
        if let Some(poses) = &poses {
            request = request.poses(poses);
        }
        if let Some(names) = names {
            request = request.names(names);
        }
        let result = session.session.run(&request)?;
        let handle = Box::into_raw(Box::new(Da3Output::new(result)));
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(output, handle) };
        Ok(())
    })
}

fn reference(options: &Da3RunOptions) -> Result<da3::RefViewStrategy, Failure> {
    use da3::RefViewStrategy as S;
    Ok(match options.reference {
        DA3_REFERENCE_SADDLE_BALANCED => S::SaddleBalanced,
        DA3_REFERENCE_FIRST => S::First,
        DA3_REFERENCE_MIDDLE => S::Middle,
        DA3_REFERENCE_SADDLE_SIM_RANGE => S::SaddleSimRange,
        DA3_REFERENCE_VIEW => S::View(options.reference_view),
        other => {
            return Err(Failure::invalid(format!(
                "options.reference {other} is none of the DA3_REFERENCE_* values"
            )))
        }
    })
}

/// The known cameras of `options`, checked (finite, a rotation, positive focal lengths).
///
/// # Safety
/// Non-null `options.extrinsics` and `options.intrinsics` must be valid for reading
/// `views * 12` and `views * 9` floats.
pub(crate) unsafe fn known_poses(
    options: &Da3RunOptions,
    views: usize,
) -> Result<Option<Vec<da3::KnownPose>>, Failure> {
    match (options.extrinsics.is_null(), options.intrinsics.is_null()) {
        (true, true) => return Ok(None),
        (false, false) => {}
        _ => {
            return Err(Failure::invalid(
                "known cameras need both options.extrinsics and options.intrinsics",
            ))
        }
    }
    let too_many = || Failure::invalid(format!("{views} views is too many"));
    // SAFETY: non-null, and the caller guarantees `views * 12` readable floats.
    let extrinsics = unsafe {
        std::slice::from_raw_parts(
            options.extrinsics,
            views.checked_mul(12).ok_or_else(too_many)?,
        )
    };
    // SAFETY: non-null, and the caller guarantees `views * 9` readable floats.
    let intrinsics = unsafe {
        std::slice::from_raw_parts(
            options.intrinsics,
            views.checked_mul(9).ok_or_else(too_many)?,
        )
    };
    let rows = |values: &[f32], width: usize| -> Vec<Vec<f64>> {
        values
            .chunks(width)
            .map(|row| row.iter().map(|&v| f64::from(v)).collect())
            .collect()
    };
    extrinsics
        .chunks(12)
        .zip(intrinsics.chunks(9))
        .enumerate()
        .map(|(view, (e, k))| {
            da3::KnownPose::new(&rows(e, 4), &rows(k, 3))
                .map_err(|error| Failure::invalid(format!("view {view}: {error}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The names of `options`, `views` of them, or `None`.
///
/// # Safety
/// A non-null `options.names` must be valid for reading `views` pointers, each NULL or a
/// NUL-terminated string.
unsafe fn names(options: &Da3RunOptions, views: usize) -> Result<Option<Vec<String>>, Failure> {
    if options.names.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and the caller guarantees `views` readable pointers.
    let pointers = unsafe { std::slice::from_raw_parts(options.names, views) };
    pointers
        .iter()
        .enumerate()
        .map(|(i, &name)| {
            // SAFETY: the caller guarantees NULL or a NUL-terminated string.
            unsafe { utf8(name, &format!("options.names[{i}]")) }.map(str::to_owned)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
