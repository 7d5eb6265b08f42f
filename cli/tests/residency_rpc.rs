//! The residency planner against a device with separate memory: a ggml RPC server in a child
//! process on loopback. Each test starts its own server, so a test that kills one (the
//! `unchecked` reproduction) leaves the others alone.
//!
//! The graph has the shape of the Metal crash: a final norm whose weight and bias sit in a
//! host context (`buffer == NULL`, like `vit.norm.weight/bias`), then a matmul on a weight
//! that does live on the device.

use da3::ggml::{rpc, Backend, BufferUsage, Context, DType, Device, Graph, Tensor, TensorView};
use da3::residency::{self, Decision, Executor, Policy, Residency};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const WIDTH: i64 = 64;
const ROWS: i64 = 8;
const OUT: i64 = 16;
const EPS: f32 = 1e-6;

// --- an RPC server per test -----------------------------------------------------------------

/// `da3 rpc-server` on a free loopback port; killed when dropped. Its stderr goes to a file
/// so that it can be read after the server dies.
struct RpcServer {
    child: Child,
    endpoint: String,
    stderr: tempfile::NamedTempFile,
}

impl RpcServer {
    fn start() -> RpcServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let stderr = tempfile::NamedTempFile::new().expect("a temp file");
        let child = isolated(Command::new(env!("CARGO_BIN_EXE_da3")))
            .args(["rpc-server", "--port", &port.to_string(), "--threads", "1"])
            .stdout(Stdio::null())
            .stderr(stderr.reopen().expect("temp file reopens"))
            .spawn()
            .expect("da3 rpc-server starts");
        let mut server = RpcServer {
            child,
            endpoint: format!("127.0.0.1:{port}"),
            stderr,
        };
        if let Err(e) = rpc::wait_until_listening(&server.endpoint, Duration::from_secs(20)) {
            panic!(
                "rpc-server never listened on {}: {e}\n{}",
                server.endpoint,
                server.stderr_text()
            );
        }
        assert!(
            server.exit_status().is_none(),
            "rpc-server exited at start:\n{}",
            server.stderr_text()
        );
        server
    }

    fn backend(&self) -> Backend {
        Backend::new(Device::rpc(&self.endpoint).expect("the RPC device")).expect("an RPC backend")
    }

    /// How the server ended, if it has.
    fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `cmd` for a helper process that takes none of this process's descriptors along.
///
/// ggml's RPC client opens its sockets without close-on-exec, and `Device::rpc` opens a
/// connection that ggml closes right after (its per-endpoint connection cache holds weak
/// references). A process spawned meanwhile keeps a copy of that socket, so the connection
/// never closes, and the server, which serves one client at a time, never accepts the next:
/// the next `Backend::new` waits for the server's hello forever, holding ggml's global
/// connection lock, and every other RPC test in the process waits behind it (observed).
/// On Linux the helper also dies with the thread that started it, so a killed test run
/// leaves no server behind.
fn isolated(mut cmd: Command) -> Command {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook makes only async-signal-safe system calls (fcntl, close_range,
        // prctl) between fork and exec, and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                close_descriptors_on_exec();
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    cmd
}

/// Marks every descriptor above stderr close-on-exec (the ones `Command` set up are 0-2).
#[cfg(unix)]
unsafe fn close_descriptors_on_exec() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) == 0 {
        return;
    }
    for fd in 3..4096 {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
}

// --- the crash's graph ---------------------------------------------------------------------

fn input_values() -> Vec<f32> {
    (0..WIDTH * ROWS)
        .map(|i| (i as f32 * 0.37).sin() * 2.0 + (i % 5) as f32 * 0.1)
        .collect()
}
fn norm_weight_values() -> Vec<f32> {
    (0..WIDTH).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect()
}
fn norm_bias_values() -> Vec<f32> {
    (0..WIDTH).map(|i| ((i % 5) as f32 - 2.0) * 0.05).collect()
}
fn proj_values() -> Vec<f32> {
    (0..WIDTH * OUT)
        .map(|i| (((i * 31) % 17) as f32 - 8.0) * 0.01)
        .collect()
}

/// Where the norm's weight and bias live.
enum NormParams<'a> {
    /// A host context: data in its pool, no buffer (the crash).
    Host,
    /// A weights buffer of this backend.
    On(&'a Backend),
}

/// The weights: the norm's `w` and `b` ([64]) and the projection `proj` ([64, 16]).
struct Weights {
    w: Tensor,
    b: Tensor,
    proj: Tensor,
}

impl Weights {
    fn new(norm_params: NormParams<'_>, proj_on: &Backend) -> Weights {
        let norm_backend = match norm_params {
            NormParams::Host => None,
            NormParams::On(backend) => Some(backend),
        };
        let [w, b]: [Tensor; 2] = tensors_with(
            norm_backend,
            &[
                ("w", &[WIDTH], norm_weight_values()),
                ("b", &[WIDTH], norm_bias_values()),
            ],
        )
        .try_into()
        .unwrap();
        let [proj]: [Tensor; 1] =
            tensors_with(Some(proj_on), &[("proj", &[WIDTH, OUT], proj_values())])
                .try_into()
                .unwrap();
        Weights { w, b, proj }
    }
}

/// Creates `[(name, ne, values)]` in one context: a host one (`None`) or a metadata one
/// allocated on `backend` as weights.
fn tensors_with(backend: Option<&Backend>, specs: &[(&str, &[i64], Vec<f32>)]) -> Vec<Tensor> {
    let ctx = match backend {
        None => Context::host(1 << 20).unwrap(),
        Some(_) => Context::metadata(specs.len()).unwrap(),
    };
    let tensors: Vec<Tensor> = specs
        .iter()
        .map(|(name, ne, _)| ctx.new_tensor(DType::F32, ne).unwrap().named(name))
        .collect();
    if let Some(backend) = backend {
        ctx.allocate_on(backend, BufferUsage::Weights).unwrap();
    }
    for (t, (_, _, values)) in tensors.iter().zip(specs) {
        ctx.write(t, values).unwrap();
    }
    tensors
}

/// `y = norm(x) * w + b` (marked output, as the crash's final norm) and `z = proj x y`.
struct CrashGraph {
    graph: Graph,
    x: Tensor,
    y: Tensor,
    z: Tensor,
}

impl CrashGraph {
    /// A graph in its own context over `weights`, as a model builds one per input.
    fn over(weights: &Weights) -> CrashGraph {
        let ctx = Context::metadata(16).unwrap();
        let x = ctx
            .new_tensor(DType::F32, &[WIDTH, ROWS])
            .unwrap()
            .named("x");
        x.mark_input();
        let normed = ctx.norm(&x, EPS).unwrap().named("normed");
        let scaled = ctx.mul(&normed, &weights.w).unwrap().named("scaled");
        let y = ctx.add(&scaled, &weights.b).unwrap().named("y");
        y.mark_output();
        let z = ctx.mul_mat(&weights.proj, &y).unwrap().named("z");
        z.mark_output();
        let graph = ctx.new_graph(32).unwrap();
        graph.expand(&z).unwrap();
        CrashGraph { graph, x, y, z }
    }
}

fn crash_graph(norm_params: NormParams<'_>, proj_on: &Backend) -> CrashGraph {
    CrashGraph::over(&Weights::new(norm_params, proj_on))
}

/// `y` and `z` computed in plain Rust (f64), independently of ggml.
fn expected() -> (Vec<f32>, Vec<f32>) {
    let (x, w, b, proj) = (
        input_values(),
        norm_weight_values(),
        norm_bias_values(),
        proj_values(),
    );
    let (width, rows, out) = (WIDTH as usize, ROWS as usize, OUT as usize);
    let mut y = Vec::with_capacity(width * rows);
    for row in x.chunks(width) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / width as f64;
        let inv = 1.0 / (var + EPS as f64).sqrt();
        y.extend(
            (0..width).map(|i| ((row[i] as f64 - mean) * inv * w[i] as f64 + b[i] as f64) as f32),
        );
    }
    let mut z = Vec::with_capacity(out * rows);
    for r in 0..rows {
        for j in 0..out {
            let dot: f64 = (0..width)
                .map(|k| proj[j * width + k] as f64 * y[r * width + k] as f64)
                .sum();
            z.push(dot as f32);
        }
    }
    (y, z)
}

/// Every value within `rel` of the expected one, relative to the largest expected magnitude
/// (values near zero are compared at the vector's scale).
fn assert_close(what: &str, got: &[f32], expected: &[f32], rel: f32) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= rel * scale,
            "{what}[{i}] = {g}, expected {e} (scale {scale})"
        );
    }
}

/// Runs the graph through `executor` and checks both outputs; returns the run's report.
fn compute_and_check(executor: &mut Executor, g: &CrashGraph) -> residency::Report {
    let run = executor.run(&g.graph).unwrap();
    run.write(&g.x, &input_values()).unwrap();
    run.compute().unwrap();
    let (y, z) = expected();
    assert_close("y", &run.read::<f32>(&g.y).unwrap(), &y, 1e-5);
    assert_close("z", &run.read::<f32>(&g.z).unwrap(), &z, 1e-5);
    run.report().clone()
}

fn executor(device: Backend, policy: Policy) -> Executor {
    Executor::new(device, Backend::cpu(2).unwrap(), policy)
        .unwrap()
        .quiet()
}

/// The operand names `node` reads, in slot order.
fn source_names(graph: &Graph, node: &str) -> Vec<String> {
    graph
        .get(node)
        .unwrap()
        .sources()
        .iter()
        .map(|s| s.name())
        .collect()
}

// --- the policies ----------------------------------------------------------------------------

#[test]
fn route_wraps_host_weights_and_schedules_over_rpc_and_cpu() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let mut exec = executor(rpc, Policy::Route);
    let report = compute_and_check(&mut exec, &g);

    // ggml numbers RPC devices per process (RPC0, RPC1, ...) as servers are added.
    assert!(report.device.starts_with("RPC"), "{}", report.device);
    let summary = report.summary();
    assert!(
        summary.contains(&format!(
            "2 tensors not on {} (w, b: no buffer)",
            report.device
        )),
        "{summary}"
    );
    assert!(
        matches!(
            report.decision,
            Decision::Sched {
                wrapped: 2,
                mirrored: 0,
                splits: Some(_)
            }
        ),
        "{summary}"
    );
    // The host tensors now have a CPU buffer the scheduler can see.
    let w = g.graph.get("w").unwrap();
    assert_eq!(
        w.buffer().map(|b| b.buffer_type().name()).as_deref(),
        Some("CPU_Mapped")
    );
}

#[test]
fn mirror_uploads_host_weights_once_and_stays_on_gallocr() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let mut exec = executor(rpc.clone(), Policy::Mirror);

    let first = compute_and_check(&mut exec, &g);
    assert_eq!(first.decision, Decision::Mirror { uploaded: 2 });
    let copies = source_names(&g.graph, "scaled");
    assert_eq!(copies[1], format!("w@RPC0[{}]", server.endpoint));
    let copy_id = g.graph.get("scaled").unwrap().sources()[1].id();
    // The prepared graph is now clean for the device: nothing would crash on gallocr.
    assert!(residency::check(&g.graph, &rpc).is_clean());

    // A second run reuses the plan: a fresh pass would find nothing and say "gallocr".
    let second = compute_and_check(&mut exec, &g);
    assert_eq!(second.decision, Decision::Mirror { uploaded: 2 });
    assert_eq!(second.summary(), first.summary());
    assert_eq!(
        g.graph.get("scaled").unwrap().sources()[1].id(),
        copy_id,
        "the copy was not replaced"
    );
}

/// The default policy mirrors host weights (constants) but routes a host tensor that is a
/// graph input: its data may change before the next compute, so a copy would go stale.
#[test]
fn auto_mirrors_host_weights_and_routes_a_host_input() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let mut exec = executor(rpc.clone(), Policy::default());
    let report = compute_and_check(&mut exec, &g);
    assert_eq!(
        report.decision,
        Decision::Mirror { uploaded: 2 },
        "{}",
        report.summary()
    );

    let weights = Weights::new(NormParams::Host, &rpc);
    weights.b.mark_input();
    let g = CrashGraph::over(&weights);
    let mut exec = executor(rpc, Policy::Auto);
    let report = compute_and_check(&mut exec, &g);
    assert!(
        matches!(report.decision, Decision::Sched { wrapped: 2, .. }),
        "{}",
        report.summary()
    );
}

#[test]
fn mirror_prepares_every_graph_rebuilt_over_the_same_weights() {
    // A model keeps its weights and builds a new graph per input; a new graph's nodes may
    // land at the addresses of the previous one's.
    let server = RpcServer::start();
    let rpc = server.backend();
    let weights = Weights::new(NormParams::Host, &rpc);
    let mut exec = executor(rpc.clone(), Policy::Mirror);
    for round in 0..3 {
        let g = CrashGraph::over(&weights);
        let report = exec.plan(&g.graph).unwrap();
        assert_eq!(
            report.decision,
            Decision::Mirror { uploaded: 2 },
            "round {round}"
        );
        let pass = residency::check(&g.graph, &rpc);
        assert!(
            pass.is_clean(),
            "round {round}: the planned graph still reads {:?}",
            pass.non_resident()
        );
        compute_and_check(&mut exec, &g);
    }
}

#[test]
fn mirror_prepares_a_graph_that_hashes_like_one_it_planned_before_preparing() {
    // What a rebuilt graph gets whenever the allocator hands back the previous graph's
    // memory (seen in the test above, not on every run): the same node addresses reading
    // the same host weights. Putting the host weights back into the prepared graph makes
    // that happen every time.
    let server = RpcServer::start();
    let rpc = server.backend();
    let weights = Weights::new(NormParams::Host, &rpc);
    let g = CrashGraph::over(&weights);
    let mut exec = executor(rpc.clone(), Policy::Mirror);
    assert_eq!(
        exec.plan(&g.graph).unwrap().decision,
        Decision::Mirror { uploaded: 2 }
    );
    g.graph
        .replace_source(&g.graph.get("scaled").unwrap(), 1, &weights.w)
        .unwrap();
    g.graph
        .replace_source(&g.graph.get("y").unwrap(), 1, &weights.b)
        .unwrap();
    assert_eq!(residency::check(&g.graph, &rpc).non_resident().len(), 2);

    assert_eq!(
        exec.plan(&g.graph).unwrap().decision,
        Decision::Mirror { uploaded: 2 }
    );
    let pass = residency::check(&g.graph, &rpc);
    assert!(
        pass.is_clean(),
        "planned but not prepared: {:?}",
        pass.non_resident()
    );
    compute_and_check(&mut exec, &g);
}

#[test]
fn strict_refuses_and_names_both_host_tensors() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let mut exec = executor(rpc, Policy::Strict);
    let report = match exec.run(&g.graph) {
        Err(residency::Error::Refused(report)) => report,
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("strict computed a graph with host operands"),
    };
    assert_eq!(report.decision, Decision::Refused);
    let text = residency::Error::Refused(report).to_string();
    assert!(
        text.contains("`w` read by `scaled` (MUL): no buffer"),
        "{text}"
    );
    assert!(text.contains("`b` read by `y` (ADD): no buffer"), "{text}");
}

#[test]
fn all_weights_on_the_device_take_gallocr() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::On(&rpc), &rpc);
    for policy in [Policy::Route, Policy::Mirror, Policy::Strict] {
        let report = compute_and_check(&mut executor(rpc.clone(), policy), &g);
        assert_eq!(report.decision, Decision::Gallocr, "{policy:?}");
        assert!(report.pass.is_clean());
    }
}

#[test]
fn cpu_target_reads_host_weights_and_takes_gallocr() {
    let cpu = Backend::cpu(2).unwrap();
    let g = crash_graph(NormParams::Host, &cpu);
    let report = compute_and_check(&mut executor(cpu, Policy::Strict), &g);
    assert_eq!(report.decision, Decision::Gallocr);
}

#[test]
fn device_weight_is_foreign_and_not_host_readable_for_the_cpu() {
    let server = RpcServer::start();
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let proj = g.graph.get("proj").unwrap();
    match residency::classify(&proj, &Backend::cpu(1).unwrap()) {
        Residency::ForeignBuffer {
            buffer_type,
            host_readable,
        } => {
            assert_eq!(buffer_type, format!("RPC0[{}]", server.endpoint));
            assert!(!host_readable);
        }
        other => panic!("proj on RPC seen from the CPU: {other:?}"),
    }
}

// --- the crash itself, in a child process --------------------------------------------------

const CHILD_ENDPOINT: &str = "DA3_TEST_UNCHECKED_RPC_ENDPOINT";
const CHILD_TEST: &str = "unchecked_compute_in_this_process";

/// The bug reproduction: gallocr on the RPC device with `w`, `b` in host memory. Runs only
/// as a child of `unchecked_path_kills_its_process`, which passes the server's endpoint.
#[test]
#[ignore = "run only as a child of unchecked_path_kills_its_process"]
fn unchecked_compute_in_this_process() {
    let endpoint = std::env::var(CHILD_ENDPOINT)
        .unwrap_or_else(|_| panic!("{CHILD_TEST} runs only as a child of unchecked_path_kills_its_process ({CHILD_ENDPOINT} unset)"));
    let rpc = Backend::new(Device::rpc(&endpoint).unwrap()).unwrap();
    let g = crash_graph(NormParams::Host, &rpc);
    let mut exec = executor(rpc, Policy::Unchecked);
    let run = exec.run(&g.graph).unwrap();
    assert_eq!(run.report().decision, Decision::Unchecked);
    run.write(&g.x, &input_values()).unwrap();
    eprintln!("child: computing unchecked on {endpoint}");
    let status = run.compute();
    // ggml's RPC client sends the graph without waiting for the server: the failure shows
    // at the next call that does wait.
    eprintln!("child: compute returned {status:?}");
    let y = run.read::<f32>(&g.y);
    eprintln!("child: read y: {:?}", y.map(|v| v[..4].to_vec()));
}

fn run_child(endpoint: &str) -> Output {
    isolated(Command::new(std::env::current_exe().unwrap()))
        .args([
            "--exact",
            CHILD_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENDPOINT, endpoint)
        // ggml's abort would otherwise attach gdb to print a backtrace.
        .env("GGML_NO_BACKTRACE", "1")
        .output()
        .expect("the test binary re-executes")
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

#[cfg(unix)]
fn signal_of(status: std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// What `unchecked` does on a device with separate memory, measured: ggml's RPC client sends
/// the graph without waiting, so `compute` returns Ok; the server's worker for that connection
/// fails on the NULL data of `w` and closes the connection; the client's next call (reading
/// `y`) finds the connection gone and ggml aborts the whole process. The `rpc-server`
/// supervisor itself survives (each connection has its own worker) and serves the next client.
#[test]
fn unchecked_path_kills_its_process() {
    let mut server = RpcServer::start();
    let out = run_child(&server.endpoint);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.stderr_text().contains("server side closed") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let server_status = server.exit_status();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = format!(
        "child {:?}, server {server_status:?}\n--- child stderr ---\n{stderr}--- server stderr ---\n{}",
        out.status,
        server.stderr_text()
    );
    eprintln!(
        "child {:?}, last stderr line {:?}; server {server_status:?}",
        out.status,
        last_line(&stderr)
    );

    assert!(
        !out.status.success(),
        "the unchecked compute did not fail:\n{report}"
    );
    assert!(
        stderr.contains("child: compute returned Ok(())"),
        "{report}"
    );
    assert!(
        !stderr.contains("child: read y"),
        "the child read a result:\n{report}"
    );
    assert!(
        last_line(&stderr).ends_with("Remote RPC server crashed or returned malformed response"),
        "{report}"
    );
    #[cfg(unix)]
    {
        assert_eq!(signal_of(out.status), Some(libc::SIGABRT), "{report}");
        assert!(server_status.is_none(), "the supervisor died:\n{report}");
        assert!(
            server
                .stderr_text()
                .contains("server side closed the connection"),
            "{report}"
        );
    }

    // This process is unaffected, and so is the server: the same graph computes correctly
    // through the planner on it.
    let rpc = server.backend();
    let g = crash_graph(NormParams::Host, &rpc);
    let report = compute_and_check(&mut executor(rpc, Policy::Route), &g);
    assert!(matches!(report.decision, Decision::Sched { .. }));
}
