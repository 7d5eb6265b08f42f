//! The costs this project's design trades between: the same DA3 graph computed through
//! gallocr with every operand resident, through the scheduler after `route`, and through
//! gallocr after `mirror`; on the CPU and on a separate-memory device (a `da3 rpc-server`
//! child on loopback). Also the residency pass alone, and graph building and allocation
//! against compute. Synthetic weights, 640x427 -> 504x336.
//!
//! `cargo bench --bench da3_paths` (presets: DA3_BENCH_PRESETS=da3-small,da3-base).

use criterion::{criterion_group, criterion_main, Criterion};
use da3::convert::{write_synthetic, WeightType};
use da3::ggml::{rpc, Backend, Device, Gallocr};
use da3::residency::{self, Policy};
use da3::{synthetic, Config, LoadOptions, Model, Session};
use da3::{Image, Request};
use std::time::Duration;

const CRASH_LAYOUT: &[&str] = &["vit.camera_token", "vit.norm.weight", "vit.norm.bias"];

/// A ggml RPC server on a loopback port, served by a thread of this process (the bench needs
/// a device with separate memory, not crash isolation).
struct Server(String);

impl Server {
    fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("127.0.0.1:{port}");
        let serve_at = endpoint.clone();
        std::thread::spawn(move || {
            // Serves until the bench process ends; a bind failure shows as the wait timing out.
            let _ = rpc::serve(&serve_at, Device::cpu(), 2);
        });
        rpc::wait_until_listening(&endpoint, Duration::from_secs(20)).unwrap();
        Server(endpoint)
    }
}

fn load(
    path: &std::path::Path,
    device: &da3::Device,
    policy: Policy,
    crash_layout: bool,
) -> Session {
    let host_only = if crash_layout {
        CRASH_LAYOUT.iter().map(|s| s.to_string()).collect()
    } else {
        Vec::new()
    };
    let options = LoadOptions {
        device: device.clone(),
        threads: 2,
        policy,
        host_only,
        ..Default::default()
    };
    Model::load(path, &options).unwrap().session().unwrap()
}

fn bench_preset(c: &mut Criterion, preset: &str, image: &Image, rpc_endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    write_synthetic(&path, &Config::preset(preset).unwrap(), WeightType::F32).unwrap();
    let cpu = Backend::cpu(2).unwrap();
    let cpu_device = da3::Device::Cpu;
    let rpc_device = da3::Device::Rpc(rpc_endpoint.to_owned());

    let mut group = c.benchmark_group(format!("{preset}/compute"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(2));
    let variants: [(&str, &da3::Device, Policy, bool); 4] = [
        ("cpu/gallocr_resident", &cpu_device, Policy::Route, false),
        ("rpc/gallocr_resident", &rpc_device, Policy::Route, false),
        ("rpc/sched_after_route", &rpc_device, Policy::Route, true),
        (
            "rpc/gallocr_after_mirror",
            &rpc_device,
            Policy::Mirror,
            true,
        ),
    ];
    for (name, device, policy, crash) in variants {
        let mut model = load(&path, device, policy, crash);
        let request = Request::image(image);
        model.run(&request).unwrap();
        eprintln!(
            "{preset} {name}: {}",
            model.last_report().unwrap().summary()
        );
        group.bench_function(name, |b| b.iter(|| model.run(&request).unwrap()));
    }
    group.finish();

    let mut group = c.benchmark_group(format!("{preset}/phases"));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    let mut model = load(&path, &cpu_device, Policy::Route, false);
    group.bench_function("build_graph", |b| {
        b.iter(|| {
            model.clear_graphs();
            model.graph(504, 336).unwrap().n_nodes()
        })
    });
    let graph = model.graph(504, 336).unwrap();
    eprintln!(
        "{preset}: {} nodes, {} leafs",
        graph.n_nodes(),
        graph.n_leafs()
    );
    let mut gallocr = Gallocr::for_backend(&cpu).unwrap();
    gallocr.reserve(graph).unwrap();
    group.bench_function("gallocr_alloc", |b| {
        b.iter(|| drop(gallocr.alloc(graph).unwrap()))
    });
    let mut sched = da3::ggml::Sched::new(std::slice::from_ref(&cpu), 16384, false).unwrap();
    sched.reserve(graph).unwrap();
    group.bench_function("sched_alloc", |b| {
        b.iter(|| drop(sched.alloc(graph, &[]).unwrap()))
    });
    group.bench_function("residency_pass", |b| {
        b.iter(|| residency::check(graph, &cpu))
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let presets =
        std::env::var("DA3_BENCH_PRESETS").unwrap_or_else(|_| "da3-small,da3-base".to_owned());
    let image = synthetic::image(640, 427);
    let server = Server::start();
    for preset in presets.split(',') {
        bench_preset(c, preset, &image, &server.0);
    }
}

criterion_group!(da3_paths, benches);
criterion_main!(da3_paths);
