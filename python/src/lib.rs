//! `da3._da3`: the Python extension module behind the `da3` package. A `Model` loads once;
//! its inferences run on a thread of their own that owns the session (sessions are
//! single-threaded), with the GIL released while they compute. Images come in as file paths or
//! `uint8` arrays `[H, W, 3]`; results go out as numpy arrays shaped as the official
//! `depth_anything_3` API returns them.

use da3::export::ExportOptions;
use da3::preprocess::ResizeMethod;
use da3::{Image, KnownPose, LoadOptions, Output, Predictor, RefViewStrategy, Request};
use numpy::{
    PyArray1, PyArrayMethods, PyReadonlyArray3, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Mutex;

/// A da3 error as the Python exception a caller would catch: bad input is a `ValueError`, a
/// file that cannot be read or written an `OSError`, anything else a `RuntimeError`; the
/// message is the library's (it names the file, flag or tensor and the cause).
fn to_py(error: da3::Error) -> PyErr {
    let message = error.to_string();
    match error {
        da3::Error::Input(_) | da3::Error::Config(_) => PyValueError::new_err(message),
        da3::Error::Ggml(ref e) if matches!(**e, da3::ggml::Error::DeviceNotFound { .. }) => {
            PyValueError::new_err(message)
        }
        da3::Error::Preprocess(da3::preprocess::PreprocessError::Open { .. })
        | da3::Error::Gguf(da3::gguf::GgufError::Io { .. })
        | da3::Error::Output { .. } => PyOSError::new_err(message),
        da3::Error::Preprocess(_) => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// What one inference asks of the worker thread (owned: it crosses threads).
struct Job {
    images: Vec<Image>,
    names: Vec<String>,
    poses: Option<Vec<KnownPose>>,
    process_res: Option<usize>,
    resize: ResizeMethod,
    reference: RefViewStrategy,
    ray_pose: bool,
    gaussians: bool,
    reply: mpsc::Sender<Result<Output, da3::Error>>,
}

/// The thread that owns a model's session and computes its jobs in turn.
fn serve_jobs(mut predictor: Box<dyn Predictor>, jobs: mpsc::Receiver<Job>) {
    for job in jobs {
        let mut request = Request::new(&job.images)
            .resize(job.resize)
            .reference(job.reference)
            .ray_pose(job.ray_pose)
            .gaussians(job.gaussians);
        if !job.names.is_empty() {
            request = request.names(job.names.iter().cloned());
        }
        if let Some(res) = job.process_res {
            request = request.process_res(res);
        }
        if let Some(poses) = &job.poses {
            request = request.poses(poses);
        }
        let _ = job.reply.send(predictor.run(&request));
    }
}

/// A Depth Anything 3 model loaded onto a device.
///
/// `Model(path, device="auto", threads=0, process_res=None, metric_model=None)`: `path` is
/// a GGUF file (depth-anything.cpp's layout, or `da3 convert`'s); `process_res` the size
/// requests default to (None: the model's, 504 for DA3's longest side, 518 for DA2's
/// shortest); `metric_model` pairs it with a metric branch (the nested model: metres).
#[pyclass(frozen, module = "da3")]
struct Model {
    jobs: Mutex<mpsc::Sender<Job>>,
    name: String,
    device: String,
    process_res: Option<usize>,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, device = "auto", threads = 0, process_res = None, metric_model = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        device: &str,
        threads: usize,
        process_res: Option<usize>,
        metric_model: Option<PathBuf>,
    ) -> PyResult<Model> {
        let device: da3::Device = device
            .parse()
            .map_err(|e| PyValueError::new_err(format!("device {device:?}: {e}")))?;
        let options = LoadOptions {
            device,
            threads,
            process_res,
            // Known cameras and 3D Gaussians are arguments of every inference, as in the
            // official API: the parts they need load where the file has them.
            camera_encoder: metric_model.is_none(),
            gaussians: metric_model.is_none(),
            log_decisions: false,
            ..LoadOptions::default()
        };
        let (sender, receiver) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        // The model loads on the worker thread, which then owns its session.
        std::thread::Builder::new()
            .name("da3 inference".into())
            .spawn(move || {
                let loaded = (|| -> Result<(Box<dyn Predictor>, String), da3::Error> {
                    let model = da3::Model::load(&path, &options)?;
                    let name = model.config().name.clone();
                    Ok(match metric_model {
                        None => (Box::new(model.session()?), name),
                        Some(metric) => {
                            let metric = da3::Model::load(metric, &options)?;
                            let nested = da3::NestedModel::new(model, metric)?;
                            (Box::new(nested.session()?), format!("{name} (nested)"))
                        }
                    })
                })();
                match loaded {
                    Ok((predictor, name)) => {
                        let device = predictor.device_name();
                        let _ = ready_tx.send(Ok((name, device)));
                        serve_jobs(predictor, receiver);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("starting the inference thread: {e}")))?;
        let (name, device) = py
            .detach(move || ready_rx.recv())
            .map_err(|_| PyRuntimeError::new_err("the inference thread died while loading"))?
            .map_err(to_py)?;
        Ok(Model {
            jobs: Mutex::new(sender),
            name,
            device,
            process_res,
        })
    }

    /// The model's name (`da3-base`, ...).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The device that computes (`CPU`, `CUDA0`, ...).
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// Depth, confidence and cameras of every image, predicted together as one scene.
    ///
    /// `images`: file paths or `uint8` arrays `[H, W, 3]` (RGB), or one of them.
    /// `extrinsics` `[N, 3, 4]` or `[N, 4, 4]` (world-to-camera) with `intrinsics` `[N, 3, 3]`
    /// (pixels of each input image): known cameras; depth then comes out in their units.
    /// `infer_gs`: also the scene's 3D Gaussians (`Prediction.gaussians`, `save_gs_ply`), for
    /// a model with a Gaussian head (DA3-GIANT).
    #[pyo3(signature = (
        images,
        extrinsics = None,
        intrinsics = None,
        process_res = None,
        process_res_method = "upper_bound_resize",
        ref_view_strategy = "saddle_balanced",
        use_ray_pose = false,
        infer_gs = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn inference(
        &self,
        py: Python<'_>,
        images: &Bound<'_, PyAny>,
        extrinsics: Option<PyReadonlyArrayDyn<'_, f64>>,
        intrinsics: Option<PyReadonlyArrayDyn<'_, f64>>,
        process_res: Option<usize>,
        process_res_method: &str,
        ref_view_strategy: &str,
        use_ray_pose: bool,
        infer_gs: bool,
    ) -> PyResult<Prediction> {
        let (images, names) = read_images(py, images)?;
        let poses = match (extrinsics, intrinsics) {
            (None, None) => None,
            (Some(e), Some(k)) => Some(known_poses(&e, &k, images.len())?),
            _ => {
                return Err(PyValueError::new_err(
                    "known cameras need both extrinsics and intrinsics",
                ))
            }
        };
        let resize: ResizeMethod = process_res_method
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("process_res_method: {e}")))?;
        let reference: RefViewStrategy = ref_view_strategy
            .parse()
            .map_err(|e: da3::Error| PyValueError::new_err(format!("ref_view_strategy: {e}")))?;
        let (reply, answer) = mpsc::channel();
        let job = Job {
            images,
            names,
            poses,
            process_res: process_res.or(self.process_res),
            resize,
            reference,
            ray_pose: use_ray_pose,
            gaussians: infer_gs,
            reply,
        };
        self.jobs
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the model's job queue is poisoned"))?
            .send(job)
            .map_err(|_| PyRuntimeError::new_err("the inference thread has stopped"))?;
        let output = py
            .detach(move || answer.recv())
            .map_err(|_| PyRuntimeError::new_err("the inference thread stopped while computing"))?
            .map_err(to_py)?;
        Ok(Prediction { output })
    }

    fn __repr__(&self) -> String {
        format!("da3.Model({:?} on {})", self.name, self.device)
    }
}

/// Paths and arrays to images, with names (file names, or `image{i}.png` for arrays).
fn read_images(py: Python<'_>, images: &Bound<'_, PyAny>) -> PyResult<(Vec<Image>, Vec<String>)> {
    let single =
        images.extract::<PathBuf>().is_ok() || images.extract::<PyReadonlyArray3<'_, u8>>().is_ok();
    let items: Vec<Bound<'_, PyAny>> = if single {
        vec![images.clone()]
    } else {
        images
            .try_iter()
            .map_err(|_| {
                PyValueError::new_err("images: a path, a uint8 array [H, W, 3], or a list of them")
            })?
            .collect::<PyResult<_>>()?
    };
    let mut out = Vec::with_capacity(items.len());
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Ok(path) = item.extract::<PathBuf>() {
            let image = py
                .detach(|| da3::load_image(&path))
                .map_err(|e| to_py(e.into()))?;
            names.push(path.display().to_string());
            out.push(image);
        } else if let Ok(array) = item.extract::<PyReadonlyArray3<'_, u8>>() {
            let shape = array.shape();
            if shape[2] != 3 {
                return Err(PyValueError::new_err(format!(
                    "image {i}: an array of shape {shape:?}; RGB images are [H, W, 3] uint8"
                )));
            }
            let data = array.as_array().iter().copied().collect();
            let image = Image::new(shape[1], shape[0], data).map_err(|e| to_py(e.into()))?;
            names.push(format!("image{i}.png"));
            out.push(image);
        } else {
            return Err(PyValueError::new_err(format!(
                "image {i}: not a path or a uint8 array [H, W, 3] (got {})",
                item.get_type().name()?
            )));
        }
    }
    Ok((out, names))
}

/// Known cameras from `[N, 3|4, 4]` extrinsics and `[N, 3, 3]` intrinsics.
fn known_poses(
    extrinsics: &PyReadonlyArrayDyn<'_, f64>,
    intrinsics: &PyReadonlyArrayDyn<'_, f64>,
    views: usize,
) -> PyResult<Vec<KnownPose>> {
    let (e, k) = (extrinsics.as_array(), intrinsics.as_array());
    let (es, ks) = (e.shape(), k.shape());
    let e_ok = es.len() == 3 && es[0] == views && (es[1] == 3 || es[1] == 4) && es[2] == 4;
    let k_ok = ks.len() == 3 && ks[0] == views && ks[1] == 3 && ks[2] == 3;
    if !e_ok || !k_ok {
        return Err(PyValueError::new_err(format!(
            "extrinsics {es:?} and intrinsics {ks:?} for {views} image(s): expected \
             [{views}, 3, 4] (or [{views}, 4, 4]) and [{views}, 3, 3]"
        )));
    }
    (0..views)
        .map(|v| {
            let rows = |a: &numpy::ndarray::ArrayViewD<'_, f64>, n: usize, m: usize| {
                (0..n)
                    .map(|r| (0..m).map(|c| a[[v, r, c]]).collect::<Vec<f64>>())
                    .collect::<Vec<_>>()
            };
            KnownPose::new(&rows(&e, es[1], 4), &rows(&k, 3, 3))
                .map_err(|err| PyValueError::new_err(format!("view {v}: {err}")))
        })
        .collect()
}

/// The result of one inference: numpy arrays over the views, and the exports.
#[pyclass(frozen, module = "da3")]
struct Prediction {
    output: Output,
}

impl Prediction {
    /// `[N, H, W]` from one plane per view.
    fn planes<'py>(
        &self,
        py: Python<'py>,
        plane: impl Fn(&da3::Prediction) -> Option<&[f32]>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let views = &self.output.views;
        if views.iter().any(|v| plane(v).is_none()) {
            return Ok(None);
        }
        let (w, h) = (views[0].width, views[0].height);
        let flat: Vec<f32> = views
            .iter()
            .flat_map(|v| plane(v).unwrap_or_default().iter().copied())
            .collect();
        Ok(Some(
            PyArray1::from_vec(py, flat)
                .reshape([views.len(), h, w])?
                .into_any(),
        ))
    }

    /// `[N, rows, cols]` from a matrix per view, `None` when a view has no camera.
    fn matrices<'py>(
        &self,
        py: Python<'py>,
        rows: usize,
        cols: usize,
        matrix: impl Fn(&da3::Pose) -> Vec<f32>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let views = &self.output.views;
        let Some(poses) = views.iter().map(|v| v.pose).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        let flat: Vec<f32> = poses.iter().flat_map(&matrix).collect();
        Ok(Some(
            PyArray1::from_vec(py, flat)
                .reshape([views.len(), rows, cols])?
                .into_any(),
        ))
    }

    fn options(max_points: Option<usize>, conf_percentile: f64, fov: Option<f32>) -> ExportOptions {
        ExportOptions {
            max_points,
            confidence_percentile: conf_percentile,
            assumed_fov: fov,
            ..ExportOptions::default()
        }
    }

    fn view(&self, view: usize) -> PyResult<&da3::Prediction> {
        self.output.views.get(view).ok_or_else(|| {
            PyValueError::new_err(format!(
                "view {view} of a prediction of {} view(s)",
                self.output.views.len()
            ))
        })
    }
}

#[pymethods]
impl Prediction {
    /// Depth `[N, H, W]` float32 at the processed resolution.
    #[getter]
    fn depth<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self
            .planes(py, |v| Some(&v.depth))?
            .expect("every view has depth"))
    }

    /// Confidence `[N, H, W]`, or None for models without one.
    #[getter]
    fn conf<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.planes(py, |v| v.confidence.as_deref())
    }

    /// Sky probability `[N, H, W]`, or None for models without a sky head.
    #[getter]
    fn sky<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.planes(py, |v| v.sky.as_deref())
    }

    /// World-to-camera `[N, 3, 4]`, or None for models without a camera decoder.
    #[getter]
    fn extrinsics<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.matrices(py, 3, 4, |p| {
            p.extrinsics.iter().flatten().copied().collect()
        })
    }

    /// Intrinsics `[N, 3, 3]` in pixels of the processed images, or None.
    #[getter]
    fn intrinsics<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.matrices(py, 3, 3, |p| {
            p.intrinsics.iter().flatten().copied().collect()
        })
    }

    /// The processed images `[N, H, W, 3]` uint8 (what the network saw, before normalising).
    #[getter]
    fn processed_images<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let views = &self.output.views;
        let (w, h) = (views[0].width, views[0].height);
        let flat: Vec<u8> = views
            .iter()
            .flat_map(|v| v.image.data.iter().copied())
            .collect();
        Ok(PyArray1::from_vec(py, flat)
            .reshape([views.len(), h, w, 3])?
            .into_any())
    }

    /// The reference view (whose camera is the world frame).
    #[getter]
    fn reference_view(&self) -> usize {
        self.output.reference
    }

    /// With known cameras: the scale the depth was divided by to reach their units.
    #[getter]
    fn pose_scale(&self) -> Option<f64> {
        self.output.pose_scale
    }

    /// From a nested model: the scale that brought depth to metres.
    #[getter]
    fn metric_scale(&self) -> Option<f64> {
        self.output.metric_scale
    }

    /// The input images' `(width, height)`.
    #[getter]
    fn input_sizes(&self) -> Vec<(usize, usize)> {
        self.output.views.iter().map(|v| v.input_size).collect()
    }

    /// The images' names (paths as given, `image{i}.png` for arrays).
    #[getter]
    fn names(&self) -> Vec<String> {
        self.output.views.iter().map(|v| v.name.clone()).collect()
    }

    fn __len__(&self) -> usize {
        self.output.views.len()
    }

    /// Every view's points in one world frame as a binary PLY (confidence-filtered, sky
    /// dropped; `fov` assumes a pinhole camera for models that predict none).
    #[pyo3(signature = (path, max_points = Some(1_000_000), conf_percentile = 40.0, fov = None))]
    fn save_ply(
        &self,
        py: Python<'_>,
        path: PathBuf,
        max_points: Option<usize>,
        conf_percentile: f64,
        fov: Option<f32>,
    ) -> PyResult<()> {
        let options = Self::options(max_points, conf_percentile, fov);
        py.detach(|| self.output.save_ply(&path, &options))
            .map_err(to_py)
    }

    /// The scene as glb (glTF 2.0): points and a frustum per camera.
    #[pyo3(signature = (path, max_points = Some(1_000_000), conf_percentile = 40.0, fov = None))]
    fn save_glb(
        &self,
        py: Python<'_>,
        path: PathBuf,
        max_points: Option<usize>,
        conf_percentile: f64,
        fov: Option<f32>,
    ) -> PyResult<()> {
        let options = Self::options(max_points, conf_percentile, fov);
        py.detach(|| self.output.save_glb(&path, &options))
            .map_err(to_py)
    }

    /// The scene as a COLMAP sparse model (text and binary) in the folder `path`.
    #[pyo3(signature = (path, conf_percentile = 40.0, fov = None))]
    fn save_colmap(
        &self,
        py: Python<'_>,
        path: PathBuf,
        conf_percentile: f64,
        fov: Option<f32>,
    ) -> PyResult<()> {
        let options = Self::options(None, conf_percentile, fov);
        py.detach(|| self.output.save_colmap(&path, &options))
            .map_err(to_py)
    }

    /// The scene's 3D Gaussians (`infer_gs=True`) as a dict of arrays, the official
    /// `Gaussians` fields without their batch axis: `means` `[G, 3]`, `scales` `[G, 3]`,
    /// `rotations` `[G, 4]`, `harmonics` `[G, 3, K]`, `opacities` `[G]` (G = views x H x W);
    /// None without them.
    #[getter]
    fn gaussians<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(g) = &self.output.gaussians else {
            return Ok(None);
        };
        let n = g.len();
        let flat = |values: Vec<f32>| PyArray1::from_vec(py, values);
        let dict = pyo3::types::PyDict::new(py);
        dict.set_item(
            "means",
            flat(g.means.iter().flatten().copied().collect()).reshape([n, 3])?,
        )?;
        dict.set_item(
            "scales",
            flat(g.scales.iter().flatten().copied().collect()).reshape([n, 3])?,
        )?;
        dict.set_item(
            "rotations",
            flat(g.rotations.iter().flatten().copied().collect()).reshape([n, 4])?,
        )?;
        dict.set_item(
            "harmonics",
            flat(g.harmonics.clone()).reshape([n, 3, g.sh_coefficients])?,
        )?;
        dict.set_item("opacities", flat(g.opacities.clone()))?;
        Ok(Some(dict.into_any()))
    }

    /// The 3D Gaussians as a 3DGS PLY file, pruned as the official `gs_ply` export (image
    /// borders, the deepest 10 % of each view); returns how many were written.
    fn save_gs_ply(&self, py: Python<'_>, path: PathBuf) -> PyResult<usize> {
        py.detach(|| {
            self.output
                .save_gaussian_ply(&path, &da3::export::GaussianPlyOptions::default())
        })
        .map_err(to_py)
    }

    /// Depth, confidence, extrinsics and intrinsics as the official `mini_npz` archive.
    fn save_npz(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.output.save_npz(&path)).map_err(to_py)
    }

    /// Every view's camera as JSON (reads back as known poses in `da3 depth --poses`).
    fn save_poses_json(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.output.save_poses_json(&path))
            .map_err(to_py)
    }

    /// View `view`'s depth as an 8-bit PNG, near = bright.
    #[pyo3(signature = (path, view = 0, colormap = "turbo"))]
    fn save_depth_png(
        &self,
        py: Python<'_>,
        path: PathBuf,
        view: usize,
        colormap: &str,
    ) -> PyResult<()> {
        let colormap: da3::Colormap = colormap
            .parse()
            .map_err(|e: da3::Error| PyValueError::new_err(format!("colormap: {e}")))?;
        let prediction = self.view(view)?;
        py.detach(|| prediction.save_png(&path, colormap))
            .map_err(to_py)
    }

    /// View `view`'s depth as PFM (float32).
    #[pyo3(signature = (path, view = 0))]
    fn save_pfm(&self, py: Python<'_>, path: PathBuf, view: usize) -> PyResult<()> {
        let prediction = self.view(view)?;
        py.detach(|| prediction.save_pfm(&path)).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        let v = &self.output.views[0];
        format!(
            "da3.Prediction({} view(s) of {}x{}, reference {})",
            self.output.views.len(),
            v.width,
            v.height,
            self.output.reference
        )
    }
}

#[pymodule]
fn _da3(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Prediction>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
