//! Devices from ggml's registry and the backends (compute streams) created on them.

use super::buffer::BufferType;
use super::error::{Error, Result};
use super::tensor::TensorView;
use ggml_sys as sys;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::rc::Rc;

/// What kind of device ggml reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU backend.
    Cpu,
    /// A discrete GPU (also what an RPC client device reports).
    Gpu,
    /// A GPU sharing host memory.
    IntegratedGpu,
    /// An accelerator ggml reports as such (e.g. BLAS).
    Accelerator,
    /// A device type this crate does not know.
    Other,
}

/// A device in ggml's registry (CPU, CUDA0, MTL0, an RPC server, ...). Registry devices live
/// for the whole process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Device {
    raw: NonNull<sys::ggml_backend_device>,
}

/// What a device can do beyond computing.
#[derive(Debug, Clone, Copy)]
pub struct DeviceCaps {
    /// Computes asynchronously (queued work needs [`Backend::synchronize`]).
    pub async_compute: bool,
    /// Has a pinned host buffer type for fast transfers.
    pub host_buffer: bool,
    /// Can wrap existing host memory in a buffer.
    pub buffer_from_host_ptr: bool,
    /// Supports events for synchronising between backends.
    pub events: bool,
}

fn c_str(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL C strings from ggml's registry are NUL-terminated and static.
    unsafe { CStr::from_ptr(ptr).to_string_lossy().into_owned() }
}

// SAFETY: a registry device lives for the whole process and is never freed; the calls made
// on it (name, description, type, memory, properties, buffer type, buffer-type support) are
// queries that ggml's backends answer from any thread (static strings and tables, or driver
// queries such as cudaMemGetInfo that are thread-safe).
unsafe impl Send for Device {}
// SAFETY: see `Send`: every method takes `&self` and only queries.
unsafe impl Sync for Device {}

impl Device {
    /// Only for registry pointers, which live for the whole process.
    pub(crate) fn from_raw(raw: NonNull<sys::ggml_backend_device>) -> Self {
        Device { raw }
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_backend_device {
        self.raw.as_ptr()
    }
    /// Every device the registry knows, GPUs first, CPU last (ggml's order).
    pub fn all() -> Vec<Device> {
        // SAFETY: registry queries; indices below the count are valid.
        let count = unsafe { sys::ggml_backend_dev_count() };
        (0..count)
            .filter_map(|i| NonNull::new(unsafe { sys::ggml_backend_dev_get(i) }))
            .map(|raw| Device { raw })
            .collect()
    }
    /// The device named `name` (case-insensitive: "CPU", "CUDA0", "MTL0", "RPC0[...]").
    pub fn by_name(name: &str) -> Result<Device> {
        Self::all()
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::DeviceNotFound {
                wanted: format!("named `{name}`"),
                available: Self::available_names(),
            })
    }
    /// The first device of a kind.
    pub fn by_kind(kind: DeviceKind) -> Result<Device> {
        Self::all()
            .into_iter()
            .find(|d| d.kind() == kind)
            .ok_or_else(|| Error::DeviceNotFound {
                wanted: format!("of kind {kind:?}"),
                available: Self::available_names(),
            })
    }
    /// The CPU device.
    pub fn cpu() -> Device {
        Self::by_kind(DeviceKind::Cpu).expect("ggml-sys always builds the CPU backend")
    }
    /// A GPU (discrete first, then integrated, then accelerators), else the CPU.
    pub fn best() -> Device {
        [
            DeviceKind::Gpu,
            DeviceKind::IntegratedGpu,
            DeviceKind::Accelerator,
        ]
        .into_iter()
        .find_map(|k| Self::by_kind(k).ok())
        .unwrap_or_else(Self::cpu)
    }
    fn available_names() -> String {
        Self::all()
            .iter()
            .map(Device::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
    /// ggml's device name (`CPU`, `CUDA0`, `MTL0`, `RPC0[HOST:PORT]`).
    pub fn name(&self) -> String {
        // SAFETY: live registry device.
        c_str(unsafe { sys::ggml_backend_dev_name(self.as_ptr()) })
    }
    /// The driver's description (e.g. the GPU model).
    pub fn description(&self) -> String {
        // SAFETY: live registry device.
        c_str(unsafe { sys::ggml_backend_dev_description(self.as_ptr()) })
    }
    /// The kind ggml reports.
    pub fn kind(&self) -> DeviceKind {
        // SAFETY: live registry device.
        match unsafe { sys::ggml_backend_dev_type(self.as_ptr()) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            _ => DeviceKind::Other,
        }
    }
    /// Free and total memory in bytes, as the device reports them.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: live registry device; out-pointers valid.
        unsafe { sys::ggml_backend_dev_memory(self.as_ptr(), &mut free, &mut total) };
        (free, total)
    }
    /// Optional capabilities the device reports.
    pub fn caps(&self) -> DeviceCaps {
        let mut props = sys::ggml_backend_dev_props::default();
        // SAFETY: live registry device; `props` is a valid out-struct.
        unsafe { sys::ggml_backend_dev_get_props(self.as_ptr(), &mut props) };
        DeviceCaps {
            async_compute: props.caps.async_,
            host_buffer: props.caps.host_buffer,
            buffer_from_host_ptr: props.caps.buffer_from_host_ptr,
            events: props.caps.events,
        }
    }
    /// The device's own memory.
    pub fn buffer_type(&self) -> Result<BufferType> {
        // SAFETY: live registry device.
        let raw = unsafe { sys::ggml_backend_dev_buffer_type(self.as_ptr()) };
        NonNull::new(raw)
            .map(BufferType::from_raw)
            .ok_or_else(|| Error::BackendInit {
                name: self.name(),
                reason: "the device has no buffer type".into(),
            })
    }
    /// Whether this device's kernels can read memory of `buffer_type`.
    pub fn supports_buffer_type(&self, buffer_type: BufferType) -> bool {
        // SAFETY: live device and buffer type.
        unsafe { sys::ggml_backend_dev_supports_buft(self.as_ptr(), buffer_type.as_ptr()) }
    }
    /// Whether this device's backend can run the op that computes `node` (asked of the
    /// device without creating a backend; the node needs no data).
    pub fn supports_op(&self, node: &impl TensorView) -> bool {
        // SAFETY: live registry device and tensor.
        unsafe { sys::ggml_backend_dev_supports_op(self.as_ptr(), node.raw().as_ptr()) }
    }
    /// Whether this is a remote device of the RPC backend (which reports itself as a GPU,
    /// whatever the server computes on).
    pub fn is_rpc(&self) -> bool {
        // RPC registries are "RPC" and, one per server, "RPC[host:port]".
        self.backend_name().starts_with("RPC")
    }
    /// The name of the backend this device belongs to: "CPU", "CUDA", "Vulkan", "Metal",
    /// "RPC", ... (empty if ggml reports none).
    pub fn backend_name(&self) -> String {
        // SAFETY: live registry device; its registry lives for the process.
        let reg = unsafe { sys::ggml_backend_dev_backend_reg(self.as_ptr()) };
        if reg.is_null() {
            return String::new();
        }
        // SAFETY: a registry's name is a C string it owns for its life.
        c_str(unsafe { sys::ggml_backend_reg_name(reg) })
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

/// A compute backend on one device: a cheap, shared handle (schedulers and allocators hold
/// clones); the backend is freed with the last one.
#[derive(Clone)]
pub struct Backend {
    inner: Rc<BackendInner>,
}

struct BackendInner {
    raw: NonNull<sys::ggml_backend>,
    device: Device,
    /// The CPU backend's worker threads. Dropped after `raw` is freed (fields drop after
    /// `Drop::drop`), so the backend never holds a freed pool.
    threadpool: RefCell<Option<ThreadPool>>,
}

/// Worker threads that a CPU backend keeps between computes: without one, ggml starts and
/// joins its threads on every graph compute, a cost paid per node when profiling and per
/// split under a scheduler.
struct ThreadPool {
    raw: NonNull<sys::ggml_threadpool>,
}

impl ThreadPool {
    /// `threads`: 1 to GGML_MAX_N_THREADS.
    fn new(threads: i32) -> Option<ThreadPool> {
        // SAFETY: plain initialisation of a params struct.
        let mut params = unsafe { sys::ggml_threadpool_params_default(threads) };
        // SAFETY: valid params with a thread count in range; NULL on failure.
        NonNull::new(unsafe { sys::ggml_threadpool_new(&mut params) }).map(|raw| ThreadPool { raw })
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // SAFETY: we own the pool and no backend uses it any more (see BackendInner); stops
        // and joins its threads, freed once.
        unsafe { sys::ggml_threadpool_free(self.raw.as_ptr()) };
    }
}

impl Backend {
    /// A backend on `device`.
    pub fn new(device: Device) -> Result<Backend> {
        // SAFETY: live registry device; NULL on failure.
        let raw = unsafe { sys::ggml_backend_dev_init(device.as_ptr(), std::ptr::null()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::BackendInit {
            name: device.name(),
            reason: "ggml_backend_dev_init returned NULL".into(),
        })?;
        Ok(Backend {
            inner: Rc::new(BackendInner {
                raw,
                device,
                threadpool: RefCell::new(None),
            }),
        })
    }
    /// The CPU backend with `threads` threads (0: one per physical core).
    pub fn cpu(threads: usize) -> Result<Backend> {
        let backend = Self::new(Device::cpu())?;
        backend.set_threads(threads);
        Ok(backend)
    }
    /// The best device's backend (see [`Device::best`]).
    pub fn best() -> Result<Backend> {
        Self::new(Device::best())
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_backend {
        self.inner.raw.as_ptr()
    }
    /// The device this backend computes on.
    pub fn device(&self) -> Device {
        self.inner.device
    }
    /// The device's name.
    pub fn name(&self) -> String {
        self.inner.device.name()
    }
    /// Whether this is the CPU backend.
    pub fn is_cpu(&self) -> bool {
        self.inner.device.kind() == DeviceKind::Cpu
    }
    /// Whether this is an RPC client backend (a remote device, which reports itself as a GPU
    /// whatever the server computes on).
    pub fn is_rpc(&self) -> bool {
        // SAFETY: live backend; a GUID comparison.
        unsafe { sys::ggml_backend_is_rpc(self.as_ptr()) }
    }
    /// Whether two handles are the same backend.
    pub fn same_as(&self, other: &Backend) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }
    /// Sets the thread count of a CPU backend (0: [`default_threads`]) and gives it a pool of that many
    /// threads, kept until the next call or the backend's end; no effect on other backends.
    pub fn set_threads(&self, threads: usize) {
        let threads = if threads == 0 {
            default_threads()
        } else {
            threads
        };
        if !self.is_cpu() {
            return;
        }
        let threads = threads.min(sys::GGML_MAX_N_THREADS as usize) as i32;
        let pool = ThreadPool::new(threads);
        let pool_ptr = pool
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.raw.as_ptr());
        // SAFETY: a live CPU backend (checked), which is what both calls require; the pool
        // (or NULL: ggml's per-compute threads) outlives its use, as the backend owns it. ggml
        // pauses the previous pool before switching, and it is freed only after the switch.
        unsafe {
            sys::ggml_backend_cpu_set_n_threads(self.as_ptr(), threads);
            sys::ggml_backend_cpu_set_threadpool(self.as_ptr(), pool_ptr);
        }
        *self.inner.threadpool.borrow_mut() = pool;
    }
    /// The memory the backend allocates by default (its device's own).
    pub fn default_buffer_type(&self) -> BufferType {
        // SAFETY: live backend.
        let raw = unsafe { sys::ggml_backend_get_default_buffer_type(self.as_ptr()) };
        BufferType::from_raw(NonNull::new(raw).expect("every backend has a default buffer type"))
    }
    /// Whether this backend can run the op that computes `node`.
    pub fn supports_op(&self, node: &impl TensorView) -> bool {
        // SAFETY: live backend and tensor.
        unsafe { sys::ggml_backend_supports_op(self.as_ptr(), node.raw().as_ptr()) }
    }
    /// Whether this backend's kernels can read memory of `buffer_type`.
    pub fn supports_buffer_type(&self, buffer_type: BufferType) -> bool {
        // SAFETY: live backend and buffer type.
        unsafe { sys::ggml_backend_supports_buft(self.as_ptr(), buffer_type.as_ptr()) }
    }
    /// Waits for queued work.
    pub fn synchronize(&self) {
        // SAFETY: live backend.
        unsafe { sys::ggml_backend_synchronize(self.as_ptr()) };
    }
}

impl Drop for BackendInner {
    fn drop(&mut self) {
        // SAFETY: we own the backend; freed once.
        unsafe { sys::ggml_backend_free(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.name())
    }
}

/// The thread count used where none is given: one per physical core this process may run
/// on. A second hardware thread of a core shares its vector units, so it adds little to
/// these compute-bound kernels and costs synchronisation. Linux reads the core topology from
/// sysfs; elsewhere, or when that fails, every logical CPU counts.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().map_or(logical, |cores| cores.clamp(1, logical))
}

/// Distinct (package, core) pairs of the online CPUs, from sysfs.
fn physical_cores() -> Option<usize> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let mut cores = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str().unwrap_or("");
        if !name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(entry.path().join("topology").join(f)).ok();
        // Offline CPUs have no topology directory.
        if let (Some(package), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((package.trim().to_owned(), core.trim().to_owned()));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// The ggml version the library reports at run time.
pub fn ggml_version() -> String {
    // SAFETY: returns a static string.
    c_str(unsafe { sys::ggml_version() })
}

/// The variant of ggml's CPU backend in this process, with the vector units ggml reports it
/// was compiled for, e.g. `haswell of x86_64,haswell,zen4 (AVX2 FMA F16C)`. (Which of our own
/// kernels run is a model's execution plan, `da3::da3::ExecutionPlan`.)
pub fn cpu_features() -> String {
    // SAFETY: argument-free queries of compile-time flags of the CPU backend in use.
    let flags: Vec<&str> = unsafe {
        [
            (sys::ggml_cpu_has_avx2(), "AVX2"),
            (sys::ggml_cpu_has_fma(), "FMA"),
            (sys::ggml_cpu_has_f16c(), "F16C"),
            (sys::ggml_cpu_has_avx512(), "AVX512"),
            (sys::ggml_cpu_has_avx512_vnni(), "AVX512_VNNI"),
            (sys::ggml_cpu_has_avx512_bf16(), "AVX512_BF16"),
            (sys::ggml_cpu_has_neon(), "NEON"),
            (sys::ggml_cpu_has_dotprod(), "DOTPROD"),
        ]
    }
    .into_iter()
    .filter(|(on, _)| *on != 0)
    .map(|(_, name)| name)
    .collect();
    let flags = if flags.is_empty() {
        "no vector extensions beyond the baseline".to_owned()
    } else {
        flags.join(" ")
    };
    let variant = match sys::cpu_variant() {
        Some(v) => format!("{v} of {}", sys::CPU_VARIANTS),
        None if sys::CPU_VARIANTS == "target" => "built for the target".to_owned(),
        // CMake (the GPU features) or prebuilt libraries: ggml's own choice of flags.
        None => "built by CMake or prebuilt".to_owned(),
    };
    format!("{variant} ({flags})")
}

pub(crate) fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument {
        op: "ffi",
        reason: format!("{what} contains a NUL byte"),
    })
}

/// Where to compute, as a person writes it: `auto`, `cpu`, a device name from ggml's registry
/// (`CUDA0`, `MTL0`, `Vulkan0`), or `rpc:HOST:PORT` for a ggml RPC server. Parses with
/// [`str::parse`] and prints back the same spelling.
///
/// ```
/// use da3::ggml::DeviceSpec;
/// assert_eq!("auto".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
/// assert_eq!("CPU".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
/// assert_eq!(
///     "rpc:127.0.0.1:50052".parse::<DeviceSpec>().unwrap(),
///     DeviceSpec::Rpc("127.0.0.1:50052".into())
/// );
/// assert!("rpc:localhost".parse::<DeviceSpec>().is_err()); // the port is missing
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// A GPU if ggml has one (discrete, then integrated, then an accelerator), else the CPU.
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// A device of ggml's registry by name, case-insensitive (`CUDA0`, `MTL0`, `Vulkan0`).
    Named(String),
    /// The first device of the ggml RPC server at `HOST:PORT`.
    Rpc(String),
}

impl DeviceSpec {
    /// The registry device this names (registering the RPC server for `rpc:`).
    pub fn resolve(&self) -> Result<Device> {
        match self {
            DeviceSpec::Auto => Ok(Device::best()),
            DeviceSpec::Cpu => Ok(Device::cpu()),
            DeviceSpec::Named(name) => Device::by_name(name),
            DeviceSpec::Rpc(endpoint) => Device::rpc(endpoint),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidArgument {
            op: "device",
            reason,
        };
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(DeviceSpec::Auto);
        }
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(DeviceSpec::Cpu);
        }
        if let Some(endpoint) = s.strip_prefix("rpc:") {
            let usage = "write rpc:HOST:PORT, e.g. rpc:127.0.0.1:50052";
            let Some((host, port)) = endpoint.rsplit_once(':') else {
                return Err(invalid(format!("`{s}`: the port is missing ({usage})")));
            };
            if host.is_empty() {
                return Err(invalid(format!("`{s}`: the host is missing ({usage})")));
            }
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(invalid(format!(
                    "`{s}`: `{port}` is not a port number 1-65535 ({usage})"
                )));
            }
            return Ok(DeviceSpec::Rpc(endpoint.to_owned()));
        }
        if s.is_empty()
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(invalid(format!(
                "`{s}` is not a device: use auto, cpu, a name from `da3 devices` (CUDA0, \
                 MTL0, Vulkan0) or rpc:HOST:PORT"
            )));
        }
        Ok(DeviceSpec::Named(s.to_owned()))
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Named(name) => f.write_str(name),
            DeviceSpec::Rpc(endpoint) => write!(f, "rpc:{endpoint}"),
        }
    }
}
