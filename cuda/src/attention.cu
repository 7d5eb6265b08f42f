// Fused attention for ggml tensors through cuDNN's scaled dot-product attention (the cuDNN
// frontend's graph API, cuDNN loaded at run time), with the conversions around it:
// strided f32 Q/K/V -> contiguous f16, cuDNN's f16 output -> the caller's f32 tensor.
// Knows nothing of any model: shapes, strides and device pointers come from the caller.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

// The frontend's dynamic-loading shim resolves every cuDNN call through this handle.
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

thread_local std::string last_error;

int fail(const std::string &message) {
    last_error = message;
    return 1;
}

#define DA3_CUDA_CHECK(call, what)                                                        \
    do {                                                                                  \
        cudaError_t status_ = (call);                                                     \
        if (status_ != cudaSuccess) {                                                     \
            return fail(std::string(what) + ": " + cudaGetErrorString(status_));          \
        }                                                                                 \
    } while (0)

// A [d, t, h, b] f32 view (ggml's order: d fastest; rows of d contiguous) to a contiguous
// [b][t][h][d] f16 array. One block row per token (blockIdx.y, looping past the grid's limit)
// and batch (blockIdx.z); each thread moves four neighbours of one row. 32-bit index math
// only: 64-bit division by a run-time value made the first version 40x slower than memory.
__global__ void gather_to_half(const float *__restrict__ src, int64_t stride_t, int64_t stride_h,
                               int64_t stride_b, int quads, int t, int h,
                               __half *__restrict__ dst) {
    const int per_token = quads * h;
    const int bi = blockIdx.z;
    for (int ti = blockIdx.y; ti < t; ti += gridDim.y) {
        const float *token = src + bi * stride_b + ti * stride_t;
        __half2 *out = reinterpret_cast<__half2 *>(dst + ((int64_t)bi * t + ti) * per_token * 4);
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < per_token;
             j += gridDim.x * blockDim.x) {
            const int hi = j / quads;
            const int q = j - hi * quads;
            const float4 v = *reinterpret_cast<const float4 *>(token + hi * stride_h + q * 4);
            out[2 * j] = __floats2half2_rn(v.x, v.y);
            out[2 * j + 1] = __floats2half2_rn(v.z, v.w);
        }
    }
}

__global__ void half_to_float(const __half *__restrict__ src, int64_t n, float *__restrict__ dst) {
    const int64_t pairs = n / 2;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < pairs;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float2 v = __half22float2(reinterpret_cast<const __half2 *>(src)[i]);
        reinterpret_cast<float2 *>(dst)[i] = v;
    }
}

int grid_for(int64_t work) {
    const int64_t blocks = (work + 255) / 256;
    return (int)(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

enum Uid : int64_t { Q_UID = 1, K_UID = 2, V_UID = 3, O_UID = 4 };

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t>;

// A device buffer that only grows.
struct Scratch {
    void *ptr = nullptr;
    size_t bytes = 0;
    int reserve(size_t need, const char *what) {
        if (need <= bytes) return 0;
        if (ptr) cudaFree(ptr);
        ptr = nullptr;
        bytes = 0;
        DA3_CUDA_CHECK(cudaMalloc(&ptr, need), std::string("cudaMalloc of ") + what);
        bytes = need;
        return 0;
    }
    ~Scratch() {
        if (ptr) cudaFree(ptr);
    }
};

}  // namespace

struct da3_cuda_attention {
    int device = 0;
    cudaStream_t stream = nullptr;
    cudnnHandle_t handle = nullptr;
    std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
    Scratch q, k, v, o, workspace;

    ~da3_cuda_attention() {
        graphs.clear();
        if (handle) fe::detail::destroy_handle(handle);
        if (stream) cudaStreamDestroy(stream);
    }
};

extern "C" {

const char *da3_cuda_last_error(void) { return last_error.c_str(); }

// Loads cuDNN (`library`: a file name the dynamic loader searches for, or a path), makes a
// handle on `device` and a stream of its own. 0 on success.
int da3_cuda_attention_new(int device, const char *library, da3_cuda_attention **out) {
    *out = nullptr;
    // cuDNN's fused flash attention runs on Ampere (sm_80) and newer: refuse older devices
    // here, at load, so that the plan keeps ggml's attention there instead of failing a run.
    int major = 0, minor = 0;
    DA3_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                   "reading the device's compute capability");
    DA3_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                   "reading the device's compute capability");
    if (major < 8)
        return fail("cuDNN's fused attention needs compute capability 8.0 or newer; CUDA" +
                    std::to_string(device) + " has " + std::to_string(major) + "." +
                    std::to_string(minor));
    if (!fe::cudnn_dlhandle) {
        void *lib = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            const char *why = dlerror();
            return fail(std::string("cannot load cuDNN (") + library + "): " + (why ? why : "?"));
        }
        fe::cudnn_dlhandle = lib;
    }
    auto state = std::make_unique<da3_cuda_attention>();
    state->device = device;
    DA3_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    DA3_CUDA_CHECK(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking),
                   "cudaStreamCreate");
    try {
        if (fe::detail::create_handle(&state->handle) != CUDNN_STATUS_SUCCESS) {
            state->handle = nullptr;
            return fail("cudnnCreate failed");
        }
        if (fe::detail::set_stream(state->handle, state->stream) != CUDNN_STATUS_SUCCESS) {
            return fail("cudnnSetStream failed");
        }
    } catch (const std::exception &e) {
        state->handle = nullptr;
        return fail(std::string("cuDNN: ") + e.what());
    }
    *out = state.release();
    return 0;
}

void da3_cuda_attention_free(da3_cuda_attention *state) { delete state; }

// The cuDNN version the loaded library reports (e.g. 92801), 0 if none is loaded.
size_t da3_cuda_cudnn_version(void) {
    if (!fe::cudnn_dlhandle) return 0;
    try {
        return fe::detail::get_backend_version();
    } catch (...) {
        return 0;
    }
}

// softmax(q k^T * scale) v per head. q: [d, tq, h, b] f32 with rows of d contiguous and the
// other strides (in elements) given; k, v: [d, tkv, h, b] likewise; out: [d, h, tq, b]
// contiguous f32 (ggml's flash_attn_ext result). Blocks until the result is written.
int da3_cuda_attention_run(da3_cuda_attention *s, const float *q, const int64_t q_strides[3],
                           const float *k, const int64_t k_strides[3], const float *v,
                           const int64_t v_strides[3], float *out, int64_t d, int64_t tq,
                           int64_t tkv, int64_t h, int64_t b, float scale) {
    if (d % 8 != 0 || d > 256) return fail("head size must be a multiple of 8 up to 256");
    if (b > 65535 || tq > INT32_MAX / 4 || tkv > INT32_MAX / 4 || h * d > INT32_MAX / 4)
        return fail("more than 65,535 batches or 2^29 tokens or elements per token");
    const int64_t *all[3] = {q_strides, k_strides, v_strides};
    const float *ptrs[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0)
            return fail("q, k and v must start on 16-byte boundaries");
        for (int j = 0; j < 3; j++)
            if (all[i][j] % 4 != 0) return fail("q, k and v strides must be multiples of 4");
    }
    DA3_CUDA_CHECK(cudaSetDevice(s->device), "cudaSetDevice");
    const size_t q_bytes = (size_t)(d * tq * h * b) * sizeof(__half);
    const size_t kv_bytes = (size_t)(d * tkv * h * b) * sizeof(__half);
    if (s->q.reserve(q_bytes, "Q") || s->k.reserve(kv_bytes, "K") ||
        s->v.reserve(kv_bytes, "V") || s->o.reserve(q_bytes, "O"))
        return 1;

    uint32_t scale_bits;
    std::memcpy(&scale_bits, &scale, sizeof scale_bits);
    const Key key{d, tq, tkv, h, b, scale_bits};
    auto found = s->graphs.find(key);
    std::shared_ptr<fe::graph::Graph> graph;
    if (found != s->graphs.end()) {
        graph = found->second;
    } else {
        try {
            graph = std::make_shared<fe::graph::Graph>();
            graph->set_io_data_type(fe::DataType_t::HALF)
                .set_intermediate_data_type(fe::DataType_t::FLOAT)
                .set_compute_data_type(fe::DataType_t::FLOAT);
            // Logical [b, h, t, d], stored [b][t][h][d].
            auto tensor = [&](const char *name, int64_t uid, int64_t t) {
                return graph->tensor(fe::graph::Tensor_attributes()
                                         .set_name(name)
                                         .set_uid(uid)
                                         .set_dim({b, h, t, d})
                                         .set_stride({t * h * d, d, h * d, 1}));
            };
            auto Q = tensor("Q", Q_UID, tq);
            auto K = tensor("K", K_UID, tkv);
            auto V = tensor("V", V_UID, tkv);
            auto options = fe::graph::SDPA_attributes()
                               .set_name("attention")
                               .set_generate_stats(false)
                               .set_attn_scale(scale);
            auto [O, stats] = graph->sdpa(Q, K, V, options);
            (void)stats;
            O->set_output(true)
                .set_uid(O_UID)
                .set_dim({b, h, tq, d})
                .set_stride({tq * h * d, d, h * d, 1});
            auto built = graph->build(s->handle, {fe::HeurMode_t::A});
            if (built.is_bad()) return fail("cuDNN attention graph: " + built.get_message());
        } catch (const std::exception &e) {
            return fail(std::string("cuDNN attention graph: ") + e.what());
        }
        s->graphs.emplace(key, graph);
    }
    int64_t workspace = 0;
    auto sized = graph->get_workspace_size(workspace);
    if (sized.is_bad()) return fail("cuDNN workspace size: " + sized.get_message());
    if (workspace > 0 && s->workspace.reserve((size_t)workspace, "the cuDNN workspace")) return 1;

    auto gather = [&](const float *src, const int64_t st[3], int64_t t, void *dst) {
        const int quads = (int)(d / 4);
        const int per_token = quads * (int)h;
        const dim3 block(128);
        const dim3 grid((unsigned)((per_token + 127) / 128), (unsigned)(t < 65535 ? t : 65535),
                        (unsigned)b);
        gather_to_half<<<grid, block, 0, s->stream>>>(src, st[0], st[1], st[2], quads, (int)t,
                                                      (int)h, static_cast<__half *>(dst));
    };
    gather(q, q_strides, tq, s->q.ptr);
    gather(k, k_strides, tkv, s->k.ptr);
    gather(v, v_strides, tkv, s->v.ptr);
    DA3_CUDA_CHECK(cudaGetLastError(), "converting q, k and v to f16");
    std::unordered_map<int64_t, void *> pack{
        {Q_UID, s->q.ptr}, {K_UID, s->k.ptr}, {V_UID, s->v.ptr}, {O_UID, s->o.ptr}};
    try {
        auto ran = graph->execute(s->handle, pack, s->workspace.ptr);
        if (ran.is_bad()) return fail("cuDNN attention: " + ran.get_message());
    } catch (const std::exception &e) {
        return fail(std::string("cuDNN attention: ") + e.what());
    }
    const int64_t n = d * tq * h * b;
    half_to_float<<<grid_for(n / 2), 256, 0, s->stream>>>(static_cast<const __half *>(s->o.ptr),
                                                          n, out);
    DA3_CUDA_CHECK(cudaGetLastError(), "converting the attention output to f32");
    DA3_CUDA_CHECK(cudaStreamSynchronize(s->stream), "attention");
    return 0;
}

}  // extern "C"
