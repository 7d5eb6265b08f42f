//! `da3 batch`: many images (files, folders, globs, video frames) with one model load per
//! device and one session per device reused for every image; outputs named after the inputs.

use super::common::{ConvPrecisionArg, DeviceArgs, ModelArgs, MAX_THREADS};
use super::inputs::{expand_inputs, IMAGE_EXTENSIONS};
use super::outputs::{check_model, named_outputs, write_exports, write_maps, OutputKind, Settings};
use super::remote::{self, DeviceFailure, RemoteDevice, WorkerArgs};
use super::video;
use anyhow::{bail, Context as _};
use da3::atomic_file;
use da3::RefViewStrategy;
use da3::{Device, LoadOptions, Policy};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Images, folders (their PNG, JPEG, WebP, TIFF, BMP and GIF files, sorted, not recursive;
    /// other files are named in the summary as skipped), glob patterns
    /// (quote them: 'shots/*.jpg') and videos (.mp4 .mov .mkv .webm .avi .m4v, decoded at
    /// --fps by the ffmpeg program).
    #[arg(value_name = "INPUT")]
    inputs: Vec<String>,
    /// More inputs, as the positional ones.
    #[arg(long = "input", value_name = "INPUT")]
    more_inputs: Vec<String>,
    /// Folder for the outputs and summary.json (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Outputs per image, comma-separated (see the list below).
    #[arg(long, value_delimiter = ',', default_value = "pfm,png")]
    outputs: Vec<OutputKind>,
    /// Frames per second taken from each video.
    #[arg(long, default_value_t = 1.0)]
    fps: f64,
    #[command(flatten)]
    settings: Settings,
    /// Size of the processed image, 14 to 2048: the longest side for Depth Anything 3
    /// (default 504), the shortest side's lower bound for Depth Anything V2 (default 518).
    #[arg(long)]
    process_res: Option<usize>,
    /// What to do with operands the device cannot read: auto, route, mirror, strict.
    #[arg(long, default_value = "auto")]
    policy: Policy,
    /// Where to compute, comma-separated for several devices at once (`cpu,rpc:HOST:PORT,...`):
    /// each device loads the model and takes the next image when it is free; results are
    /// in input order either way. An `rpc:` device that fails during the run (its server
    /// dies, resets or stalls) is taken out and its image computed by another device.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    device: Vec<Device>,
    /// For `rpc:` devices: seconds to wait for the model to load, and then for each image,
    /// before the device counts as stalled (its worker process is killed and the device
    /// taken out).
    #[arg(long, value_name = "SECS", default_value_t = remote::DEFAULT_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    device_timeout: u64,
    /// CPU threads of the local CPU device (0: one per physical core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Read the images' pixels as stored, ignoring their EXIF orientation (as the official
    /// loader does), instead of upright.
    #[arg(long)]
    ignore_exif_orientation: bool,
}

/// One image to compute.
struct Job {
    /// The input as the user named it.
    input: PathBuf,
    /// For a video frame: its number (from 0) and time in seconds.
    frame: Option<(usize, f64)>,
    /// The file to decode (the input, or an extracted frame).
    source: PathBuf,
    /// Output names start with this.
    stem: String,
}

/// The files written for one image, and its processed size.
type Written = (Vec<PathBuf>, (usize, usize));

/// What became of one input (or a video that could not be decoded).
struct Outcome {
    input: PathBuf,
    frame: Option<(usize, f64)>,
    device: Option<String>,
    result: anyhow::Result<Written>,
    seconds: f64,
}

impl Outcome {
    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "input": self.input });
        if let Some((n, t)) = self.frame {
            v["frame"] = n.into();
            v["time"] = t.into();
        }
        if let Some(d) = &self.device {
            v["device"] = d.clone().into();
        }
        match &self.result {
            Ok((written, (w, h))) => {
                v["status"] = "ok".into();
                v["processed_size"] = serde_json::json!([w, h]);
                v["outputs"] = serde_json::json!(written);
            }
            Err(e) => {
                v["status"] = "failed".into();
                v["error"] = format!("{e:#}").into();
            }
        }
        v["seconds"] = self.seconds.into();
        v
    }
}

/// Unique output stems (`photo`, `photo-2`, ...).
struct Stems(HashMap<String, usize>);

impl Stems {
    fn next(&mut self, stem: String) -> String {
        let n = self.0.entry(stem.clone()).or_insert(0);
        *n += 1;
        if *n == 1 {
            stem
        } else {
            format!("{stem}-{n}")
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.policy == Policy::Unchecked {
        bail!("--policy unchecked exists only inside `da3 repro`; use route, mirror or strict");
    }
    args.settings.check()?;
    if !(args.fps.is_finite() && args.fps > 0.0 && args.fps <= 1000.0) {
        bail!(
            "--fps {}: frames per second is above 0 and at most 1000",
            args.fps
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = (4 * cpus).min(MAX_THREADS);
    if args.threads > limit {
        bail!("--threads {}: at most {limit} (4 per CPU available here, {cpus}, and never more than {MAX_THREADS})", args.threads);
    }
    if args.device.is_empty() {
        bail!("--device: name at least one device");
    }
    let mut seen = HashSet::new();
    if let Some(d) = args.device.iter().find(|d| !seen.insert(d.to_string())) {
        bail!("--device: {d} is named twice (one session per device)");
    }
    let mut all: Vec<String> = args.inputs.clone();
    all.extend(args.more_inputs.iter().cloned());
    if all.is_empty() {
        bail!("no inputs: name images, folders, glob patterns or videos");
    }
    let (inputs, skipped) = expand_inputs(&all)?;
    for path in &skipped {
        log::warn!("{}: not an image format da3 reads; skipped", path.display());
    }
    if inputs.is_empty() {
        bail!(
            "no input images (folders are searched for {} files)",
            IMAGE_EXTENSIONS.join(", ")
        );
    }
    // Sizes are checked before the model is loaded.
    if let Some(res) = args.process_res {
        da3::Request::check_process_res(res)
            .map_err(|e| anyhow::anyhow!("--process-res {res}: {e}"))?;
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("--out-dir {}", args.out_dir.display()))?;
    let summary_path = args.out_dir.join("summary.json");
    super::common::check_outputs(&[("the summary", summary_path.as_path())], &[])?;

    // Models first (one per device, each on its own), so that a device that does not work
    // fails the run before anything is computed. `rpc:` devices load in worker processes
    // (see `remote`), started first so that they load while this process loads the others.
    args.model.warn_if_builtin();
    let timeout = Duration::from_secs(args.device_timeout);
    let mut remotes: Vec<Option<RemoteDevice>> = Vec::new();
    let options_for = |device: &Device| -> anyhow::Result<LoadOptions> {
        Ok(LoadOptions {
            device: device.clone(),
            threads: args.threads,
            policy: args.policy,
            process_res: args.process_res,
            log_decisions: args.device.len() == 1,
            plan: super::plan::overrides(&[])?,
            ..LoadOptions::default()
        })
    };
    for device in &args.device {
        if !matches!(device, Device::Rpc(_)) {
            remotes.push(None);
            continue;
        }
        let device_args = DeviceArgs {
            device: device.clone(),
            threads: args.threads,
            conv_precision: ConvPrecisionArg::Auto,
            plan: Vec::new(),
        };
        let worker = WorkerArgs::new(&args.model, None, device_args, &options_for(device)?)
            .with_focal(args.settings.focal().as_ref());
        remotes.push(Some(RemoteDevice::start(&worker, timeout)?));
    }
    let mut engines = Vec::new();
    for (device, remote) in args.device.iter().zip(&mut remotes) {
        let engine = match remote.take() {
            None => Engine::Local(args.model.load(&options_for(device)?)?),
            Some(mut remote) => match remote.wait_ready() {
                Ok(Ok(())) => Engine::Remote(remote),
                Ok(Err(load_error)) => return Err(load_error),
                Err(failure) => bail!("--device {device}: {failure}"),
            },
        };
        // The device as it was resolved (`auto` names the one it picked).
        let label = match &engine {
            Engine::Local(model) => model.device().name(),
            Engine::Remote(_) => device.to_string(),
        };
        engines.push((label, engine));
    }
    let config = match engines.iter().find_map(|(_, e)| match e {
        Engine::Local(model) => Some(model.config().clone()),
        Engine::Remote(_) => None,
    }) {
        Some(config) => config,
        None => args.model.config()?,
    };
    let device_names: Vec<String> = engines.iter().map(|(name, _)| name.clone()).collect();
    let (maps, exports) = named_outputs(Path::new(""), "", &args.outputs);
    check_model(&config, &maps, &exports, &args.settings)?;

    // Inputs to jobs: videos become their frames, extracted into a temporary folder.
    // Registered for the signal handler's cleanup: an interrupted run leaves no frames behind.
    let frames_dir = da3::atomic_file::TemporaryDir::new("da3-frames.")
        .context("a temporary folder for video frames")?;
    let mut stems = Stems(HashMap::new());
    let mut jobs = Vec::new();
    let mut failed_early = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let base = input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into());
        if video::is_video(input) {
            let t0 = Instant::now();
            let dir = frames_dir.path().join(i.to_string());
            match video::extract_frames(input, args.fps, &dir) {
                Ok(frames) => {
                    let stem = stems.next(base);
                    for (n, frame) in frames.into_iter().enumerate() {
                        jobs.push(Job {
                            input: input.clone(),
                            frame: Some((n, n as f64 / args.fps)),
                            source: frame,
                            stem: format!("{stem}-{n:06}"),
                        });
                    }
                }
                Err(error) => failed_early.push((
                    jobs.len(),
                    Outcome {
                        input: input.clone(),
                        frame: None,
                        device: None,
                        result: Err(error),
                        seconds: t0.elapsed().as_secs_f64(),
                    },
                )),
            }
        } else {
            jobs.push(Job {
                input: input.clone(),
                frame: None,
                source: input.clone(),
                stem: stems.next(base),
            });
        }
    }
    // No output may be one of the inputs (an input inside --out-dir named like an output).
    let input_ids: HashSet<(u64, u64)> = inputs.iter().filter_map(|p| file_id(p)).collect();

    let bar = ProgressBar::new(jobs.len() as u64);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} images  {per_sec}  ETA {eta}  {wide_msg}",
            )
            .expect("a valid template"),
        );
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    for (_, outcome) in &failed_early {
        report_failure(&bar, outcome);
    }

    let started = Instant::now();
    let queue = Arc::new(Queue::new(jobs.len()));
    let jobs = Arc::new(jobs);
    let (tx, rx) = mpsc::channel::<Event>();
    let writing = Arc::new(Writing {
        out_dir: args.out_dir.clone(),
        outputs: args.outputs.clone(),
        settings: args.settings.clone(),
        input_ids,
        process_res: args.process_res,
        read_options: da3::ReadOptions {
            apply_orientation: !args.ignore_exif_orientation,
        },
    });
    let mut workers = Vec::new();
    for (name, engine) in engines {
        let (jobs, queue, tx, writing) = (jobs.clone(), queue.clone(), tx.clone(), writing.clone());
        let worker = std::thread::Builder::new()
            .name(format!("da3 {name}"))
            .spawn(move || {
                let mut compute = match engine {
                    Engine::Local(model) => match model.session() {
                        Ok(session) => Compute::Local(Box::new(session)),
                        Err(e) => {
                            return Err(anyhow::Error::new(e).context(format!("--device {name}")))
                        }
                    },
                    Engine::Remote(remote) => Compute::Remote(remote),
                };
                while let Some(taken) = queue.take() {
                    let job = &jobs[taken.index];
                    let t0 = Instant::now();
                    let result = match writing.compute_and_write(job, &mut compute) {
                        Ok(result) => result,
                        Err(failure) => {
                            // The image goes back to the queue for another device; this one
                            // is out (its worker is gone).
                            let index = taken.give_back();
                            let _ = tx.send(Event::DeviceFailed {
                                device: name,
                                index,
                                failure,
                            });
                            return Ok(());
                        }
                    };
                    let outcome = Outcome {
                        input: job.input.clone(),
                        frame: job.frame,
                        device: Some(name.clone()),
                        result,
                        seconds: t0.elapsed().as_secs_f64(),
                    };
                    if tx.send(Event::Done(taken.done(), outcome)).is_err() {
                        return Ok(());
                    }
                }
                Ok(())
            })
            .context("starting a worker thread")?;
        workers.push(worker);
    }
    drop(tx);
    let mut results: Vec<Option<Outcome>> = (0..jobs.len()).map(|_| None).collect();
    let mut device_failures = Vec::new();
    for event in rx {
        match event {
            Event::Done(i, outcome) => {
                if outcome.result.is_err() {
                    report_failure(&bar, &outcome);
                }
                bar.set_message(outcome.input.display().to_string());
                results[i] = Some(outcome);
                bar.inc(1);
            }
            Event::DeviceFailed {
                device,
                index,
                failure,
            } => {
                let job = &jobs[index];
                let what = match job.frame {
                    Some((n, _)) => format!("{} frame {n}", job.input.display()),
                    None => job.input.display().to_string(),
                };
                bar.suspend(|| {
                    log::warn!(
                        "--device {device}: {failure} while computing {what}; the device is \
                         taken out (its image goes to the devices left)"
                    )
                });
                let mut entry = serde_json::json!({
                    "device": device,
                    "input": job.input,
                    "reason": failure.reason,
                });
                if let Some((n, t)) = job.frame {
                    entry["frame"] = n.into();
                    entry["time"] = t.into();
                }
                device_failures.push(entry);
            }
        }
    }
    bar.finish_and_clear();
    let mut worker_errors = Vec::new();
    for worker in workers {
        match worker.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => worker_errors.push(e),
            Err(_) => worker_errors.push(anyhow::anyhow!("a worker thread panicked")),
        }
    }
    // Input order: each job's outcome, with failed videos where their frames would be.
    let mut ordered: Vec<Outcome> = Vec::new();
    let mut early = failed_early.into_iter().peekable();
    for (i, outcome) in results.into_iter().enumerate() {
        while let Some((_, o)) = early.next_if(|(at, _)| *at == i) {
            ordered.push(o);
        }
        ordered.push(outcome.unwrap_or_else(|| Outcome {
            input: jobs[i].input.clone(),
            frame: jobs[i].frame,
            device: None,
            result: Err(anyhow::anyhow!("not computed: no device could take it")),
            seconds: 0.0,
        }));
    }
    ordered.extend(early.map(|(_, o)| o));
    let failed = ordered.iter().filter(|o| o.result.is_err()).count();
    let summary = serde_json::json!({
        "model": args.model.describe(),
        "devices": device_names,
        "inputs": inputs.len(),
        "images": jobs.len(),
        "ok": ordered.len() - failed,
        "failed": failed,
        "seconds": started.elapsed().as_secs_f64(),
        "device_failures": device_failures,
        "skipped": skipped,
        "results": ordered.iter().map(Outcome::json).collect::<Vec<_>>(),
    });
    atomic_file::write(&summary_path, |out| {
        serde_json::to_writer_pretty(&mut *out, &summary).map_err(std::io::Error::other)?;
        out.write_all(b"\n")
    })?;
    for e in &worker_errors {
        eprintln!("Error: {e:#}");
    }
    outln!(
        "{} of {} images done, {failed} failed; summary in {}",
        ordered.len() - failed,
        ordered.len(),
        summary_path.display()
    );
    Ok(if failed > 0 || !worker_errors.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A device of the batch, loaded: a model in this process, or a worker process that has
/// loaded it on an `rpc:` device.
enum Engine {
    Local(da3::Model),
    Remote(RemoteDevice),
}

/// A device computing: a session in this process, or a remote device's worker.
enum Compute {
    Local(Box<da3::Session>),
    Remote(RemoteDevice),
}

/// What the device threads tell the main thread.
enum Event {
    /// Job `.0` came out so (computed, or failed as an input).
    Done(usize, Outcome),
    /// A device failed computing job `index` (given back to the queue) and is out.
    DeviceFailed {
        device: String,
        index: usize,
        failure: DeviceFailure,
    },
}

/// How every image's outputs are named and written.
struct Writing {
    out_dir: PathBuf,
    outputs: Vec<OutputKind>,
    settings: Settings,
    /// No output may be one of the inputs (an input inside --out-dir named like an output).
    input_ids: HashSet<(u64, u64)>,
    process_res: Option<usize>,
    read_options: da3::ReadOptions,
}

impl Writing {
    /// Computes one image and writes its outputs: the files written and the processed size,
    /// or the error the image met; or the failure of the (remote) device, with nothing
    /// written.
    fn compute_and_write(
        &self,
        job: &Job,
        compute: &mut Compute,
    ) -> Result<anyhow::Result<Written>, DeviceFailure> {
        let (maps, exports) = named_outputs(&self.out_dir, &job.stem, &self.outputs);
        let mut planned: Vec<PathBuf> = maps.files().iter().map(|(_, p)| p.to_path_buf()).collect();
        planned.extend(exports.files().into_iter().map(|(_, p)| p));
        if let Some(p) = planned
            .iter()
            .find(|p| file_id(p).is_some_and(|id| self.input_ids.contains(&id)))
        {
            return Ok(Err(anyhow::anyhow!(
                "output {} is one of the inputs; refusing to overwrite it",
                p.display()
            )));
        }
        let image = match da3::load_image_with(&job.source, &self.read_options) {
            Ok(image) => image,
            Err(e) => return Ok(Err(e.into())),
        };
        let name = match job.frame {
            Some(_) => format!("{}.png", job.stem),
            None => job
                .input
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| job.stem.clone()),
        };
        let work = remote::Job {
            images: std::slice::from_ref(&image),
            names: vec![name],
            process_res: self.process_res,
            reference: RefViewStrategy::default(),
            ray_pose: false,
            poses: None,
            gaussians: false,
        };
        let output = match compute {
            Compute::Local(session) => session
                .run(&work.request_with(self.settings.focal().as_ref()))
                .map_err(anyhow::Error::from),
            Compute::Remote(remote) => remote.run(&work)?,
        };
        Ok((|| {
            let output = output?;
            let prediction = &output.views[0];
            let mut written = write_maps(prediction, &maps, &self.settings)?;
            written.extend(write_exports(&output, &exports, &self.settings)?);
            Ok((written, (prediction.width, prediction.height)))
        })())
    }
}

/// Which image a device takes next: one a failed device gave back, else the next in input
/// order. A device that finds none waits while others compute, since any of them may fail
/// and give its image back; once none is left and none is in flight, every device is done.
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

struct QueueState {
    next: usize,
    total: usize,
    given_back: VecDeque<usize>,
    in_flight: usize,
}

/// An image a device took: it is [`Taken::done`], or given back ([`Taken::give_back`], also
/// when the thread that took it panics).
struct Taken<'a> {
    queue: &'a Queue,
    index: usize,
    settled: bool,
}

impl Queue {
    fn new(total: usize) -> Queue {
        Queue {
            state: Mutex::new(QueueState {
                next: 0,
                total,
                given_back: VecDeque::new(),
                in_flight: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Option<Taken<'_>> {
        let mut state = self.lock();
        loop {
            let index = match state.given_back.pop_front() {
                Some(index) => Some(index),
                None if state.next < state.total => {
                    state.next += 1;
                    Some(state.next - 1)
                }
                None => None,
            };
            if let Some(index) = index {
                state.in_flight += 1;
                return Some(Taken {
                    queue: self,
                    index,
                    settled: false,
                });
            }
            if state.in_flight == 0 {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn settle(&self, index: usize, given_back: bool) {
        let mut state = self.lock();
        state.in_flight -= 1;
        if given_back {
            state.given_back.push_back(index);
        }
        self.changed.notify_all();
    }
}

impl Taken<'_> {
    /// The image was computed (or failed as an input); its index.
    fn done(mut self) -> usize {
        self.settled = true;
        self.queue.settle(self.index, false);
        self.index
    }
    /// The image goes back for another device; its index.
    fn give_back(mut self) -> usize {
        self.settled = true;
        self.queue.settle(self.index, true);
        self.index
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.queue.settle(self.index, true);
        }
    }
}

fn report_failure(bar: &ProgressBar, outcome: &Outcome) {
    if let Err(e) = &outcome.result {
        let what = match outcome.frame {
            Some((n, _)) => format!("{} frame {n}", outcome.input.display()),
            None => outcome.input.display().to_string(),
        };
        bar.suspend(|| eprintln!("{what}: {e:#} (skipped)"));
    }
}

/// Device and inode of an existing file.
#[cfg(unix)]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<(u64, u64)> {
    None
}
