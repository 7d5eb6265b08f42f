//! The C API called as C calls it: statuses, messages, NULLs, threads.

use super::*;

fn last_error() -> String {
    // SAFETY: `da3_last_error` never returns NULL and the string lives until the next
    // status-returning call on this thread.
    unsafe { CStr::from_ptr(da3_last_error()) }
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_panic_becomes_a_status_and_a_message() {
    let status = guard(|| panic!("on purpose"));
    assert_eq!(status, Da3Status::Panic);
    assert!(last_error().contains("on purpose"), "{}", last_error());
    assert_eq!(guard(|| Ok(())), Da3Status::Ok);
    assert_eq!(last_error(), "");
}

#[test]
fn errors_are_per_thread() {
    guard(|| Err(Failure::invalid("main thread's")));
    std::thread::spawn(|| {
        assert_eq!(last_error(), "");
        guard(|| Err(Failure::invalid("other thread's")));
        assert_eq!(last_error(), "other thread's");
    })
    .join()
    .unwrap();
    assert_eq!(last_error(), "main thread's");
}

#[test]
fn a_nul_in_a_message_does_not_cut_it() {
    guard(|| Err(Failure::invalid("a\0b")));
    assert_eq!(last_error(), "a\u{FFFD}b");
}

#[test]
fn the_version_is_the_package_version() {
    // SAFETY: a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(da3_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

use crate::image::*;
use crate::model::*;
use crate::output::*;
use crate::session::*;
use std::ptr::{null, null_mut};

fn fixture(name: &str) -> CString {
    let path = format!(
        "{}/../tests/fixtures/peer/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    CString::new(path).unwrap()
}

/// The repository's tiny model on the CPU at a small process resolution.
fn load_model() -> *mut Da3Model {
    let options = Da3LoadOptions {
        device: c"cpu".as_ptr(),
        threads: 2,
        process_res: 112,
        ..da3_load_options_default()
    };
    let mut model = null_mut();
    let file = fixture("peer-tiny-seed0-f32.gguf");
    // SAFETY: a NUL-terminated path, valid options and out-pointer.
    let status = unsafe { da3_model_load(file.as_ptr(), &options, &mut model) };
    assert_eq!(status, Da3Status::Ok, "{}", last_error());
    model
}

fn load_image() -> *mut Da3Image {
    let mut image = null_mut();
    let file = fixture("test-640x480.png");
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    let status = unsafe { da3_image_load(file.as_ptr(), &mut image) };
    assert_eq!(status, Da3Status::Ok, "{}", last_error());
    image
}

#[test]
fn nulls_are_invalid_arguments_and_out_pointers_are_cleared() {
    let stale = std::ptr::dangling_mut::<Da3Model>();
    let mut model = stale;
    // SAFETY: every pointer is NULL or valid; NULL is what is under test.
    unsafe {
        assert_eq!(
            da3_model_load(null(), null(), &mut model),
            Da3Status::InvalidArgument
        );
        assert!(
            model.is_null(),
            "a failed load leaves NULL, not the old value"
        );
        assert_eq!(last_error(), "path is NULL");
        let file = fixture("peer-tiny-seed0-f32.gguf");
        assert_eq!(
            da3_model_load(file.as_ptr(), null(), null_mut()),
            Da3Status::InvalidArgument
        );
        assert_eq!(last_error(), "model is NULL");
        let mut session = null_mut();
        assert_eq!(
            da3_session_new(null(), &mut session),
            Da3Status::InvalidArgument
        );
        let mut output = null_mut();
        let status = da3_session_run(null_mut(), null(), 1, null(), &mut output);
        assert_eq!(status, Da3Status::InvalidArgument);
        let mut depth = null();
        let status = da3_output_depth(null(), 0, &mut depth, null_mut(), null_mut());
        assert_eq!(status, Da3Status::InvalidArgument);
        assert_eq!(da3_output_views(null()), 0);
        let status = da3_output_pose(null(), 0, null_mut(), null_mut());
        assert_eq!(status, Da3Status::InvalidArgument);
        let status = da3_image_from_rgb(2, 2, null(), &mut null_mut());
        assert_eq!(status, Da3Status::InvalidArgument);
        assert_eq!(
            da3_output_save_ply(null(), DA3_ALL_VIEWS, null(), null()),
            Da3Status::InvalidArgument
        );
        assert_eq!(da3_session_free(null_mut()), Da3Status::Ok);
        da3_model_free(null_mut());
        da3_image_free(null_mut());
        da3_output_free(null_mut());
    }
}

#[test]
fn statuses_say_what_kind_of_failure() {
    let mut model = null_mut();
    let mut image = null_mut();
    // SAFETY: valid strings, buffers and out-pointers.
    unsafe {
        let missing = c"/no/such/model.gguf";
        assert_eq!(
            da3_model_load(missing.as_ptr(), null(), &mut model),
            Da3Status::Io
        );
        assert!(
            last_error().contains("/no/such/model.gguf"),
            "{}",
            last_error()
        );
        let not_a_model = fixture("test-640x480.png");
        assert_eq!(
            da3_model_load(not_a_model.as_ptr(), null(), &mut model),
            Da3Status::Model
        );
        let options = Da3LoadOptions {
            device: c"NoSuchDevice7".as_ptr(),
            ..da3_load_options_default()
        };
        let file = fixture("peer-tiny-seed0-f32.gguf");
        assert_eq!(
            da3_model_load(file.as_ptr(), &options, &mut model),
            Da3Status::Device
        );
        let garbage = [1u8, 2, 3, 4];
        let status = da3_image_decode(garbage.as_ptr(), garbage.len(), &mut image);
        assert_eq!(status, Da3Status::Image);
        assert!(image.is_null());
        assert_eq!(
            da3_image_from_rgb(0, 5, garbage.as_ptr(), &mut image),
            Da3Status::Image
        );
        let status = da3_image_from_rgb(usize::MAX, 2, garbage.as_ptr(), &mut image);
        assert_eq!(status, Da3Status::Image);
    }
}

#[test]
fn known_cameras_are_checked_before_the_run() {
    let identity = [1.0f32, 0., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0.];
    let intrinsics = [100.0f32, 0., 50., 0., 100., 40., 0., 0., 1.];
    let mut options = Da3RunOptions {
        extrinsics: identity.as_ptr(),
        intrinsics: intrinsics.as_ptr(),
        ..da3_run_options_default()
    };
    // SAFETY: 12 and 9 floats for one view.
    let poses = unsafe { crate::session::known_poses(&options, 1) }.unwrap();
    assert_eq!(poses.map(|p| p.len()), Some(1));
    let skewed = [2.0f32, 0., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0.];
    options.extrinsics = skewed.as_ptr();
    // SAFETY: as above.
    let failure = unsafe { crate::session::known_poses(&options, 1) }.unwrap_err();
    assert_eq!(failure.status, Da3Status::InvalidArgument);
    assert!(
        failure.message.starts_with("view 0: "),
        "{}",
        failure.message
    );
    options.intrinsics = null();
    // SAFETY: as above.
    let failure = unsafe { crate::session::known_poses(&options, 1) }.unwrap_err();
    assert!(failure.message.contains("both"), "{}", failure.message);
}

/// A session serves only its own thread; models, images and outputs any thread.
#[test]
fn a_session_refuses_other_threads() {
    let model = load_model();
    let image = load_image();
    let mut session = null_mut();
    // SAFETY: a live model and a valid out-pointer.
    assert_eq!(
        unsafe { da3_session_new(model, &mut session) },
        Da3Status::Ok
    );
    // Raw pointers are not `Send`; C hands them between threads as numbers.
    let (model_address, session_address, image_address) =
        (model as usize, session as usize, image as usize);
    let output_address = std::thread::spawn(move || {
        let session = session_address as *mut Da3Session;
        let images = [image_address as *const Da3Image];
        let mut output = null_mut();
        // SAFETY: live handles; the session is used by this thread alone meanwhile.
        let status = unsafe { da3_session_run(session, images.as_ptr(), 1, null(), &mut output) };
        assert_eq!(status, Da3Status::WrongThread);
        assert!(last_error().contains("another thread"), "{}", last_error());
        // SAFETY: as above; refused, so the session stays alive.
        assert_eq!(unsafe { da3_session_free(session) }, Da3Status::WrongThread);
        // A session of its own works here.
        let mut own = null_mut();
        // SAFETY: the model is shared by every thread; valid out-pointers.
        unsafe {
            let model = model_address as *const Da3Model;
            assert_eq!(da3_session_new(model, &mut own), Da3Status::Ok);
            let status = da3_session_run(own, images.as_ptr(), 1, null(), &mut output);
            assert_eq!(status, Da3Status::Ok, "{}", last_error());
            assert_eq!(da3_session_free(own), Da3Status::Ok);
        }
        output as usize
    });
    let output = output_address.join().unwrap() as *mut Da3Output;
    // SAFETY: live handles, each freed once; the session on its own thread.
    unsafe {
        assert_eq!(da3_output_views(output), 1);
        let mut depth = null();
        let (mut width, mut height) = (0, 0);
        let status = da3_output_depth(output, 0, &mut depth, &mut width, &mut height);
        assert_eq!(status, Da3Status::Ok);
        assert_eq!((width, height), (112, 84));
        let mut sky = null();
        let status = da3_output_sky(output, 0, &mut sky, null_mut(), null_mut());
        assert_eq!(status, Da3Status::NotAvailable);
        assert!(sky.is_null());
        let mut scale = 0.0;
        assert_eq!(
            da3_output_pose_scale(output, &mut scale),
            Da3Status::NotAvailable
        );
        assert_eq!(
            da3_output_save_png(output, 0, c"x.png".as_ptr(), 99),
            Da3Status::InvalidArgument
        );
        da3_output_free(output);
        assert_eq!(da3_session_free(session), Da3Status::Ok);
        da3_image_free(image);
        da3_model_free(model);
    }
}

/// 3D Gaussians through the C API: asked for per run of a model loaded with its Gaussian
/// head; the arrays are the library's, one Gaussian per pixel; the PLY export writes some;
/// without them both calls say NOT_AVAILABLE.
#[test]
fn gaussians_are_available_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gs.gguf");
    let config = da3::Config::preset("da3-tiny-gs").unwrap();
    da3::convert::write_synthetic(&path, &config, da3::convert::WeightType::F32).unwrap();
    let file = CString::new(path.to_str().unwrap()).unwrap();
    let options = Da3LoadOptions {
        device: c"cpu".as_ptr(),
        threads: 2,
        process_res: 56,
        gaussians: true,
        ..da3_load_options_default()
    };
    let image = load_image();
    let images = [image.cast_const()];
    let ply = CString::new(dir.path().join("gs.ply").to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated strings, valid options, live handles and out-pointers; every
    // handle is freed once, on this thread.
    unsafe {
        let (mut model, mut session) = (null_mut(), null_mut());
        assert_eq!(
            da3_model_load(file.as_ptr(), &options, &mut model),
            Da3Status::Ok
        );
        assert_eq!(da3_session_new(model, &mut session), Da3Status::Ok);
        for asked in [false, true] {
            let run = Da3RunOptions {
                gaussians: asked,
                ..da3_run_options_default()
            };
            let mut output = null_mut();
            let status = da3_session_run(session, images.as_ptr(), 1, &run, &mut output);
            assert_eq!(status, Da3Status::Ok, "{}", last_error());
            let mut g = std::mem::MaybeUninit::<Da3Gaussians>::uninit();
            let status = da3_output_gaussians(output, g.as_mut_ptr());
            let mut written = 0usize;
            let saved = da3_output_save_gs_ply(output, ply.as_ptr(), &mut written);
            if !asked {
                assert_eq!(status, Da3Status::NotAvailable);
                assert_eq!(saved, Da3Status::NotAvailable);
                assert!(last_error().contains("gaussians"), "{}", last_error());
            } else {
                assert_eq!(status, Da3Status::Ok, "{}", last_error());
                let g = g.assume_init();
                let (mut depth, mut w, mut h) = (null(), 0usize, 0usize);
                assert_eq!(
                    da3_output_depth(output, 0, &mut depth, &mut w, &mut h),
                    Da3Status::Ok
                );
                assert_eq!(g.count, w * h);
                assert_eq!(g.sh_coefficients, 9);
                let opacities = std::slice::from_raw_parts(g.opacities, g.count);
                assert!(opacities.iter().all(|o| (0.0..=1.0).contains(o)));
                let means = std::slice::from_raw_parts(g.means, 3 * g.count);
                assert!(means.iter().all(|v| v.is_finite()));
                let harmonics = std::slice::from_raw_parts(g.harmonics, 27 * g.count);
                assert!(harmonics.iter().all(|v| v.is_finite()));
                assert_eq!(saved, Da3Status::Ok, "{}", last_error());
                assert!(written > 0 && written < g.count, "{written} of {}", g.count);
            }
            da3_output_free(output);
        }
        assert_eq!(da3_session_free(session), Da3Status::Ok);
        da3_model_free(model);
        da3_image_free(image);
    }
}
