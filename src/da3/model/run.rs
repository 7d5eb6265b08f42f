//! [`Session::run`]: a [`Request`] preprocessed, computed as one scene through the session's
//! graphs ([`super::graphs`]) and post-processed into an [`Output`].

use super::graphs::{GraphKey, Part};
use super::{PartLoad, Session};
use crate::da3::config::{DepthActivation, Family};
use crate::da3::head::RAY_CHANNELS;
use crate::da3::metric;
use crate::da3::multiview::{
    camera_slots, positional_reference, select_reference_view, RefViewStrategy,
};
use crate::da3::outputs::{fill_sky, Pose, Prediction, RayMap};
use crate::da3::poses::{self, KnownPose};
use crate::da3::preprocess::{self, ProcessedImage, ResizeMethod, ResizePlan};
use crate::da3::request::{Output, Predictor, Request, Timings};
use crate::da3::Error;
use crate::ggml::TensorView;

/// Upsampling beyond this factor is worth a warning: the network sees mostly interpolation.
const MAX_QUIET_UPSCALE: f64 = 4.0;

/// A request's images preprocessed, with the plans that say how (for the intrinsics of
/// known cameras).
pub(crate) struct Prepared {
    pub images: Vec<ProcessedImage>,
    plans: Vec<ResizePlan>,
}

impl Prepared {
    /// Preprocesses every image of `request` at its process resolution (`default_res`
    /// unless it says), the views on up to `threads` threads at once (0: one per core);
    /// an error naming the views when they reach different sizes.
    pub fn new(
        request: &Request<'_>,
        family: Family,
        default_res: usize,
        threads: usize,
    ) -> Result<Prepared, Error> {
        let res = request.process_res_or(default_res);
        let (plans, images) = match family {
            Family::Da3 => {
                let plans = request.processed_plans(default_res)?;
                let images = preprocess_views(request.images(), threads, |im, threads| {
                    preprocess::preprocess_by_threads(im, res, request.resize, threads)
                })?;
                (plans, images)
            }
            Family::Da2 { .. } => {
                if request.resize != ResizeMethod::default() {
                    return Err(Error::Input(format!(
                        "Depth Anything V2 has one preprocessing (the shortest side to at \
                         least the process resolution, one bicubic resize); resize method `{}` \
                         is DA3's",
                        request.resize
                    )));
                }
                let plans = request
                    .images()
                    .iter()
                    .map(|im| da2_plan(im.width, im.height, res))
                    .collect::<Result<Vec<_>, _>>()?;
                let images = preprocess_views(request.images(), threads, |im, _| {
                    preprocess::preprocess_da2(im, res)
                })?;
                (plans, images)
            }
        };
        for (i, (input, processed)) in request.images().iter().zip(&images).enumerate() {
            let growth = processed.width as f64 / input.width as f64;
            if growth > MAX_QUIET_UPSCALE {
                log::warn!(
                    "{} is {}x{}: upsampled {growth:.0}x to {}x{}; depth from so few pixels \
                     means little",
                    request.name(i),
                    input.width,
                    input.height,
                    processed.width,
                    processed.height
                );
            }
        }
        Ok(Prepared { images, plans })
    }

    /// The request's views of `output` carry what their exports need: the processed image,
    /// the input's size and name.
    pub fn attach(self, output: &mut Output, request: &Request<'_>) {
        let inputs = request.images();
        for (i, (view, processed)) in output.views.iter_mut().zip(self.images).enumerate() {
            view.image = processed.rgb8;
            view.input_size = (inputs[i].width, inputs[i].height);
            view.name = request.name(i);
        }
    }
}

impl Request<'_> {
    /// The resize plan of every image at the request's process resolution (`default_res`
    /// unless it says), checked before anything is computed: an error naming the image
    /// whose size is refused, or the first two views that reach different processed sizes.
    pub fn processed_plans(&self, default_res: usize) -> Result<Vec<ResizePlan>, Error> {
        let res = self.process_res_or(default_res);
        let plans = self
            .images()
            .iter()
            .enumerate()
            .map(|(i, im)| {
                preprocess::plan_resize_by(im.width, im.height, res, self.resize).map_err(|e| {
                    match self.images().len() {
                        1 => Error::Preprocess(e),
                        _ => Error::Input(format!("{}: {e}", self.name(i))),
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let size = |p: &ResizePlan| (p.width, p.height);
        if let Some(i) = plans.iter().position(|p| size(p) != size(&plans[0])) {
            return Err(Error::Input(format!(
                "the views of a scene must reach one processed size: view 0 becomes {}x{}, \
                 view {i} {}x{}",
                plans[0].width, plans[0].height, plans[i].width, plans[i].height
            )));
        }
        Ok(plans)
    }
}

/// DA2's preprocessing as a [`ResizePlan`]: one bicubic step to the processed size.
fn da2_plan(width: usize, height: usize, res: usize) -> Result<ResizePlan, Error> {
    let (w, h) = preprocess::da2_processed_size(width, height, res)?;
    Ok(ResizePlan {
        bound: ((w, h) != (width, height)).then_some(preprocess::ResizeStep {
            width: w,
            height: h,
            interpolation: preprocess::Interpolation::Cubic,
        }),
        patch: None,
        crop: None,
        width: w,
        height: h,
    })
}

/// `preprocess` of each image, in order, spread over up to `threads` scoped threads (0: one
/// per core): a scene's views are independent, and one view of DA3's input takes a few
/// milliseconds of one core, which a 16-view scene on a GPU would otherwise wait for in turn.
/// With fewer images than threads, each image gets its share of the threads (its second
/// argument) for its own resizes: a 12-megapixel photo's takes tens of milliseconds alone.
fn preprocess_views<T: Send>(
    images: &[preprocess::RgbImage8],
    threads: usize,
    preprocess: impl Fn(&preprocess::RgbImage8, usize) -> Result<T, preprocess::PreprocessError> + Sync,
) -> Result<Vec<T>, Error> {
    let threads = if threads == 0 {
        crate::ggml::default_threads()
    } else {
        threads
    }
    .max(1);
    let per_image = (threads / images.len().max(1)).max(1);
    let per_thread = images.len().div_ceil(threads).max(1);
    if per_thread >= images.len() {
        return Ok(images
            .iter()
            .map(|im| preprocess(im, per_image))
            .collect::<Result<_, _>>()?);
    }
    let chunks: Vec<Result<Vec<T>, _>> = std::thread::scope(|scope| {
        let workers: Vec<_> = images
            .chunks(per_thread)
            .map(|chunk| {
                let preprocess = &preprocess;
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|im| preprocess(im, per_image))
                        .collect::<Result<Vec<T>, _>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("preprocessing does not panic"))
            .collect()
    });
    let mut out = Vec::with_capacity(images.len());
    for chunk in chunks {
        out.extend(chunk?);
    }
    Ok(out)
}

impl Predictor for Session {
    fn run(&mut self, request: &Request<'_>) -> Result<Output, Error> {
        request.check()?;
        self.check_outputs(request)?;
        let started = std::time::Instant::now();
        let prepared = Prepared::new(
            request,
            self.model.shared.config.family,
            self.model.process_res(),
            self.model.threads(),
        )?;
        let preprocessed = std::time::Instant::now();
        let mut output = self.run_prepared(&prepared, request)?;
        output.timings = Timings {
            preprocess: preprocessed - started,
            compute: preprocessed.elapsed(),
        };
        prepared.attach(&mut output, request);
        Ok(output)
    }

    fn device_name(&self) -> String {
        self.device().name()
    }

    fn release_buffers(&mut self) -> Result<(), Error> {
        Session::release_buffers(self)
    }
}

impl Session {
    /// Refuses what this model cannot compute: rays without a ray branch, known poses
    /// without a camera encoder.
    pub(crate) fn check_outputs(&self, request: &Request<'_>) -> Result<(), Error> {
        if self.model.shared.config.is_da2() {
            let refused = if request.images().len() > 1 {
                Some(format!(
                    "{} images as one scene: Depth Anything V2 predicts one image at a time \
                     (no multi-view); give one image, or each in a request of its own (`da3 \
                     batch`)",
                    request.images().len()
                ))
            } else if request.poses.is_some() {
                Some("known camera poses: Depth Anything V2 has no camera branch".to_owned())
            } else if request.rays || request.ray_pose {
                Some("rays or ray pose: Depth Anything V2 has no ray branch".to_owned())
            } else if request.gaussians {
                Some("3D Gaussians: Depth Anything V2 has no Gaussian head".to_owned())
            } else {
                None
            };
            if let Some(what) = refused {
                return Err(Error::Input(what));
            }
        }
        if request.rays && self.layers.rays.is_none() {
            return Err(Error::Input(
                "this model file has no ray branch (`head.scratch.*_aux` tensors; DualDPT \
                 models only, kept by `da3 convert`)"
                    .to_owned(),
            ));
        }
        if request.ray_pose && self.layers.rays.is_none() {
            return Err(Error::Input(
                "ray pose needs the ray branch, which this model file does not have \
                 (`head.scratch.*_aux` tensors; DualDPT models only, kept by `da3 convert`)"
                    .to_owned(),
            ));
        }
        if request.gaussians && self.layers.gaussians.is_none() {
            return Err(Error::Input(
                if self.model.shared.gaussian_head == PartLoad::LeftOut {
                    "the model was loaded without its 3D Gaussian head, which Gaussians need: \
                     load it with `LoadOptions { gaussians: true, .. }`"
                } else {
                    "this model file has no 3D Gaussian head (`gs.*` tensors; DA3-GIANT has \
                     one: convert its checkpoint again with this version of `da3 convert`)"
                }
                .to_owned(),
            ));
        }
        // The metric model takes known poses for their intrinsics (its metres' focal).
        let metric = self.model.shared.config.is_metric();
        if request.poses.is_some() && self.layers.camera_encoder.is_none() && !metric {
            return Err(Error::Input(
                if self.model.shared.camera_encoder == PartLoad::LeftOut {
                    "the model was loaded without its camera encoder, which known poses \
                     need: load it with `LoadOptions { camera_encoder: true, .. }`"
                } else {
                    "this model file has no camera encoder (`cam_enc.*` tensors), so it \
                     cannot take known poses; convert the checkpoint again with `da3 convert`"
                }
                .to_owned(),
            ));
        }
        Ok(())
    }

    /// [`Predictor::run`] on images already preprocessed (a nested model's two branches
    /// share them).
    pub(crate) fn run_prepared(
        &mut self,
        prepared: &Prepared,
        request: &Request<'_>,
    ) -> Result<Output, Error> {
        let images = &prepared.images;
        let metric = self.model.shared.config.is_metric();
        // The known cameras' intrinsics in pixels of the processed images, once for the
        // encoder's input and the alignment (or placement) after it.
        let intrinsics = request
            .poses
            .map(|known| processed_intrinsics(prepared, request, known));
        let mut output = match (request.poses, &intrinsics) {
            (Some(known), Some(k)) if !metric => self.run_posed(prepared, request, known, k)?,
            _ => {
                let extras = SceneExtras {
                    rays: request.rays || request.ray_pose,
                    gaussians: request.gaussians,
                };
                let (mut output, raw_gaussians) =
                    self.forward_scene(images, request.reference, None, extras)?;
                if request.ray_pose {
                    solve_ray_poses(&mut output, request.rays)?;
                }
                // Placed by the final cameras: a ray pose is solved after the forward.
                if let Some(raw) = raw_gaussians {
                    self.place_gaussians(&mut output, &raw)?;
                }
                output
            }
        };
        self.check_finite(&output)?;
        // DA2's outputs say what they are whatever the request: disparity or metres.
        let unit = match self.model.shared.config.head.activation {
            DepthActivation::Exp => None,
            DepthActivation::Relu => Some(metric::DepthUnit::Disparity),
            DepthActivation::Sigmoid { .. } => Some(metric::DepthUnit::Metres),
        };
        if let Some(unit) = unit {
            for view in &mut output.views {
                view.depth_unit = unit;
            }
        }
        if !request.raw {
            for view in &mut output.views {
                postprocess(view);
            }
            if metric {
                metric::to_metres(
                    &mut output.views,
                    request.images(),
                    |i| request.name(i),
                    &prepared.plans,
                    request.poses,
                    request.focal.as_ref(),
                );
                if let (Some(known), Some(intrinsics)) = (request.poses, &intrinsics) {
                    // The given cameras place the views (the depth is already in metres).
                    for ((view, pose), k) in output.views.iter_mut().zip(known).zip(intrinsics) {
                        view.pose = Some(Pose {
                            intrinsics: k.map(|row| row.map(|v| v as f32)),
                            extrinsics: std::array::from_fn(|r| {
                                pose.extrinsics[r].map(|v| v as f32)
                            }),
                        });
                    }
                }
            } else if let (Some(known), Some(intrinsics)) = (request.poses, &intrinsics) {
                let given: Vec<poses::Mat4> = known.iter().map(|p| p.extrinsics).collect();
                let scale = poses::align_to_known_poses(&mut output.views, &given, intrinsics)?;
                output.pose_scale = Some(scale);
                for view in &mut output.views {
                    view.depth_unit = metric::DepthUnit::KnownCameras;
                }
            }
        }
        Ok(output)
    }

    /// The network's outputs for views with known cameras: their normalised extrinsics and
    /// processed intrinsics encoded as the camera encoder's input, view 0 the reference;
    /// depth and poses in the normalised frame (before the alignment to the given cameras).
    fn run_posed(
        &mut self,
        prepared: &Prepared,
        request: &Request<'_>,
        known: &[KnownPose],
        intrinsics: &[poses::Mat3],
    ) -> Result<Output, Error> {
        let given: Vec<poses::Mat4> = known.iter().map(|p| p.extrinsics).collect();
        let normalized = poses::normalize_extrinsics(&given);
        let encodings: Vec<f32> = normalized
            .iter()
            .zip(intrinsics)
            .zip(&prepared.images)
            .flat_map(|((e, k), im)| poses::pose_encoding(e, k, im.width, im.height))
            .collect();
        let extras = SceneExtras {
            rays: request.rays,
            gaussians: false,
        };
        let (output, _) = self.forward_scene(
            &prepared.images,
            RefViewStrategy::First,
            Some(&encodings),
            extras,
        )?;
        Ok(output)
    }

    /// The scene's Gaussians from the head's raw output, by the views' final cameras and
    /// their depth before post-processing (as the official adapter takes them).
    fn place_gaussians(&self, output: &mut Output, raw: &[f32]) -> Result<(), Error> {
        let cfg = self
            .model
            .shared
            .config
            .gaussians
            .expect("a Gaussian head was computed");
        let poses = output
            .views
            .iter()
            .map(|v| v.pose)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Input("3D Gaussians need every view's camera".to_owned()))?;
        let depth: Vec<&[f32]> = output.views.iter().map(|v| v.depth.as_slice()).collect();
        let (w, h) = (output.views[0].width, output.views[0].height);
        output.gaussians = Some(crate::da3::gaussians::place(
            &cfg, raw, w, h, &depth, &poses,
        )?);
        Ok(())
    }

    /// Every view's depth must hold a finite value; a warning counts the rest.
    fn check_finite(&self, output: &Output) -> Result<(), Error> {
        let views = output.views.len();
        for (i, view) in output.views.iter().enumerate() {
            let finite = view.depth.iter().filter(|v| v.is_finite()).count();
            let which = match views {
                1 => String::new(),
                _ => format!(" of view {i}"),
            };
            if finite == 0 {
                return Err(Error::Input(format!(
                    "{}: every depth value{which} is NaN or infinite (weights out of range?)",
                    self.model.shared.config.name
                )));
            }
            if finite < view.depth.len() {
                log::warn!(
                    "{} of {} depth values{which} are NaN or infinite",
                    view.depth.len() - finite,
                    view.depth.len()
                );
            }
        }
        Ok(())
    }

    /// The network's outputs for preprocessed views of one scene (all of one size), in their
    /// order, before post-processing: `strategy` picks the reference view when there are three
    /// or more and no known cameras (`pose_encoding`, 9 values a view, the camera encoder's
    /// input); `extras` adds the ray branch and the Gaussian head, whose raw output comes back
    /// beside the outputs (placed by [`Self::place_gaussians`] once the poses are final).
    pub(crate) fn forward_scene(
        &mut self,
        images: &[ProcessedImage],
        strategy: RefViewStrategy,
        pose_encoding: Option<&[f32]>,
        extras: SceneExtras,
    ) -> Result<(Output, Option<Vec<f32>>), Error> {
        let first = images
            .first()
            .ok_or_else(|| Error::Input("a scene needs at least one view".to_owned()))?;
        let (w, h) = (first.width, first.height);
        if let Some(other) = images.iter().find(|im| (im.width, im.height) != (w, h)) {
            return Err(Error::Input(format!(
                "the views of a scene must share one processed size: {w}x{h} and {}x{}",
                other.width, other.height
            )));
        }
        let views = images.len();
        let mut chw = Vec::with_capacity(first.chw.len() * views);
        for im in images {
            chw.extend_from_slice(&im.chw);
        }
        let alt_start = self.model.shared.config.vit.alt_start;
        let posed = pose_encoding.is_some();
        let rays = extras.rays && self.layers.rays.is_some();
        let gaussians = extras.gaussians && self.layers.gaussians.is_some();
        let key = |part| GraphKey {
            width: w,
            height: h,
            views,
            part,
            posed,
            rays,
            gaussians,
        };
        // Known cameras: no selection (the official backbone selects only without them).
        let known = if posed {
            Some(0)
        } else {
            positional_reference(views, strategy)
        };
        let (reference, part, tokens, carried) = match (known, alt_start) {
            (None, Some(cut)) if cut >= 1 => {
                // Run to the selection point, select, continue from the tokens.
                self.graph_of(key(Part::Stem(cut - 1)))?;
                let stem = &self.graphs[&key(Part::Stem(cut - 1))];
                let run = self.executor.run(&stem.graph)?;
                run.write(&stem.input, &chw)?;
                run.compute()?;
                let tokens = run.read::<f32>(stem.tokens_out.as_ref().expect("stem output"))?;
                let carried = stem
                    .carried
                    .iter()
                    .map(|t| run.read::<f32>(t))
                    .collect::<Result<Vec<_>, _>>()?;
                drop(run);
                let e = self.model.shared.config.vit.embed_dim;
                let per_view = tokens.len() / views;
                let token0: Vec<f32> = (0..views)
                    .flat_map(|v| tokens[v * per_view..v * per_view + e].iter().copied())
                    .collect();
                let reference = select_reference_view(&token0, e, strategy);
                (reference, Part::Trunk(cut - 1), Some(tokens), carried)
            }
            _ => (known.unwrap_or(0), Part::Whole, None, Vec::new()),
        };
        self.graph_of(key(part))?;
        let graph = &self.graphs[&key(part)];
        let run = self.executor.run(&graph.graph)?;
        self.last_report = Some(run.report().clone());
        // A trunk starts from the stem's tokens, a whole graph from the image.
        run.write(&graph.input, tokens.as_deref().unwrap_or(&chw))?;
        if let Some(image) = &graph.image {
            run.write(image, &chw)?;
        }
        if let (Some(t), Some(values)) = (&graph.pose_encoding, pose_encoding) {
            run.write(t, values)?;
        }
        for (t, values) in graph.carried.iter().zip(&carried) {
            run.write(t, values)?;
        }
        if let Some(slots) = &graph.slots {
            run.write(slots, &camera_slots(views, reference))?;
        }
        run.compute()?;
        let read =
            |t: &Option<crate::ggml::Tensor>| t.as_ref().map(|t| run.read::<f32>(t)).transpose();
        let (depth, confidence, sky, pose) = (
            read(&graph.depth)?.expect("the trunk ends in depth"),
            read(&graph.confidence)?,
            read(&graph.sky)?,
            read(&graph.pose)?,
        );
        let ray_maps = match &graph.rays {
            Some((ray, conf)) => {
                let (rw, rh) = (ray.ne()[0] as usize, ray.ne()[1] as usize);
                Some((rw, rh, run.read::<f32>(ray)?, run.read::<f32>(conf)?))
            }
            None => None,
        };
        let raw_gaussians = read(&graph.gaussians)?;
        let mut probes = Vec::new();
        for (name, t) in &graph.probes {
            probes.push((name.clone(), run.read::<f32>(t)?));
        }
        let plane = w * h;
        let per_view = |values: &Option<Vec<f32>>, v: usize, n: usize| {
            values.as_ref().map(|all| all[v * n..(v + 1) * n].to_vec())
        };
        let predictions = (0..views)
            .map(|v| Prediction {
                width: w,
                height: h,
                depth: depth[v * plane..(v + 1) * plane].to_vec(),
                confidence: per_view(&confidence, v, plane),
                sky: per_view(&sky, v, plane),
                pose: per_view(&pose, v, 9).map(|enc| Pose::from_encoding(&enc, w, h)),
                // Probes hold every view (views last).
                probes: probes.clone(),
                rays: ray_maps.as_ref().map(|(rw, rh, ray, conf)| {
                    let n = rw * rh;
                    RayMap {
                        width: *rw,
                        height: *rh,
                        rays: ray[v * RAY_CHANNELS * n..(v + 1) * RAY_CHANNELS * n].to_vec(),
                        confidence: conf[v * n..(v + 1) * n].to_vec(),
                    }
                }),
                ..Prediction::default()
            })
            .collect();
        let output = Output {
            views: predictions,
            reference,
            strategy,
            pose_scale: None,
            metric_scale: None,
            timings: Default::default(),
            gaussians: None,
        };
        Ok((output, raw_gaussians))
    }
}

/// What a scene's forward computes beyond depth, confidence, sky and the camera decoder's poses.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SceneExtras {
    /// The DualDPT ray branch.
    pub rays: bool,
    /// The 3D Gaussian head.
    pub gaussians: bool,
}

/// The intrinsics of the known cameras in pixels of the processed images.
fn processed_intrinsics(
    prepared: &Prepared,
    request: &Request<'_>,
    known: &[KnownPose],
) -> Vec<poses::Mat3> {
    known
        .iter()
        .zip(request.images())
        .zip(&prepared.plans)
        .map(|((pose, im), plan)| {
            poses::processed_intrinsics(&pose.intrinsics, im.width, im.height, plan)
        })
        .collect()
}

/// Each view's camera from its ray map (the official `use_ray_pose`); the maps are dropped
/// afterwards unless `keep_rays`, as the official forward drops them.
fn solve_ray_poses(output: &mut Output, keep_rays: bool) -> Result<(), Error> {
    for (i, view) in output.views.iter_mut().enumerate() {
        let rays = view
            .rays
            .as_ref()
            .expect("ray pose computes the ray branch");
        let pose = crate::da3::ray_pose::pose_from_rays(rays, view.width, view.height)
            .map_err(|e| Error::Input(format!("view {i}: {e}")))?;
        view.pose = Some(pose);
        if !keep_rays {
            view.rays = None;
        }
    }
    Ok(())
}

/// The official post-processing of the raw outputs: sky regions of mono and metric models
/// get the depth of the far non-sky scene.
pub(crate) fn postprocess(prediction: &mut Prediction) {
    if let Some(sky) = &prediction.sky {
        fill_sky(&mut prediction.depth, sky);
    }
}
