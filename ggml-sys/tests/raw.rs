//! The raw bindings against the compiled library: a matrix product on the CPU backend, the
//! same product through an RPC server on loopback, and the bindings' header fingerprint.

use ggml_sys as sys;
use std::ffi::CString;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const M: usize = 3;
const N: usize = 2;
const K: usize = 4;

fn a_values() -> Vec<f32> {
    (0..M * K).map(|i| i as f32 * 0.5 - 2.0).collect()
}
fn b_values() -> Vec<f32> {
    (0..N * K).map(|i| (i as f32).sin()).collect()
}

/// ggml's mul_mat(a[K,M], b[K,N]) = b * a^T as [M, N] in ggml order: out[n][m] = sum_k a[m][k] b[n][k].
fn expected() -> Vec<f32> {
    let (a, b) = (a_values(), b_values());
    let mut out = vec![0.0f32; M * N];
    for n in 0..N {
        for m in 0..M {
            out[n * M + m] = (0..K).map(|k| a[m * K + k] * b[n * K + k]).sum();
        }
    }
    out
}

/// Runs the product on `backend` and returns the result read back from it.
unsafe fn matmul_on(backend: sys::ggml_backend_t) -> Vec<f32> {
    let params = sys::ggml_init_params {
        mem_size: sys::ggml_tensor_overhead() * 8 + sys::ggml_graph_overhead(),
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    let ctx = sys::ggml_init(params);
    assert!(!ctx.is_null());
    let a = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, M as i64);
    let b = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, N as i64);
    let c = sys::ggml_mul_mat(ctx, a, b);
    let graph = sys::ggml_new_graph(ctx);
    sys::ggml_build_forward_expand(graph, c);
    let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
    assert!(!buffer.is_null());
    let (av, bv) = (a_values(), b_values());
    sys::ggml_backend_tensor_set(a, av.as_ptr().cast(), 0, av.len() * 4);
    sys::ggml_backend_tensor_set(b, bv.as_ptr().cast(), 0, bv.len() * 4);
    assert_eq!(
        sys::ggml_backend_graph_compute(backend, graph),
        sys::GGML_STATUS_SUCCESS
    );
    let mut out = vec![0.0f32; M * N];
    sys::ggml_backend_tensor_get(c, out.as_mut_ptr().cast(), 0, out.len() * 4);
    sys::ggml_backend_buffer_free(buffer);
    sys::ggml_free(ctx);
    out
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn matmul_on_cpu_backend() {
    unsafe {
        let backend = sys::ggml_backend_cpu_init();
        assert!(!backend.is_null());
        assert_close(&matmul_on(backend), &expected());
        sys::ggml_backend_free(backend);
    }
}

#[test]
fn matmul_through_rpc_server_on_loopback() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let server_endpoint = CString::new(endpoint.clone()).unwrap();
    // The serve loop never returns; the thread ends with the test process.
    std::thread::spawn(move || unsafe {
        let mut cpu = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        sys::ggml_backend_rpc_start_server(
            server_endpoint.as_ptr(),
            std::ptr::null(),
            1,
            1,
            &mut cpu,
        );
    });
    // ggml's client aborts on an unreachable server, so wait until it accepts connections.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&endpoint).is_err() {
        assert!(
            Instant::now() < deadline,
            "RPC server did not start on {endpoint}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        let c_endpoint = CString::new(endpoint).unwrap();
        let backend = sys::ggml_backend_rpc_init(c_endpoint.as_ptr(), 0);
        assert!(!backend.is_null());
        assert!(sys::ggml_backend_is_rpc(backend));
        assert_close(&matmul_on(backend), &expected());
        sys::ggml_backend_free(backend);
    }
}

#[test]
fn committed_bindings_match_the_headers_built_against() {
    if sys::BUILD_HEADERS_FINGERPRINT == "unknown" {
        // A prebuilt library without GGML_INCLUDE_DIR: the runtime version is all we can see.
        let version = unsafe { std::ffi::CStr::from_ptr(sys::ggml_version()) };
        assert!(!version.to_bytes().is_empty());
        return;
    }
    assert_eq!(
        sys::BINDINGS_HEADERS_FINGERPRINT,
        sys::BUILD_HEADERS_FINGERPRINT,
        "src/bindings.rs was generated from other headers than ggml {}: run ggml-sys/regenerate-bindings.sh",
        sys::GGML_SOURCE_VERSION
    );
    assert_eq!(sys::GGML_SOURCE_VERSION, "0.26.0");
}
