//! `da3 serve`'s accept loop: hyper's HTTP/1 connections with a header timeout, at most
//! `--max-connections` of them open at once, and which one gives way when that many are.
//!
//! Stalled clients (a request head or an upload, then silence) each hold a connection and a
//! file descriptor. Without a cap, enough of them exhaust the open-files limit and `accept`
//! fails for everyone until they leave. With a cap alone, they fill the cap instead. So when
//! the cap is reached, the open connection that has waited longest on its client (no byte
//! read or written for the longest time, and no request of it computing) is closed to make
//! room: a stalled client loses its place to one that is talking. Only when every connection
//! is computing is the new one closed at once.

use super::Metrics;
use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Files the server keeps open besides its connections (standard streams, the listener, the
/// runtime's poller and wakers, the model file while loading, a response's temporary files),
/// kept free when the open-files limit bounds `--max-connections`.
const RESERVED_FILES: u64 = 64;

/// How long to wait before accepting again after an `accept` error other than a peer giving
/// up, so that a persistent one (out of file descriptors, out of memory) cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// After running out of files and closing a connection: time for its task to drop it.
const ROOM_MADE_PAUSE: Duration = Duration::from_millis(2);

/// `requested`, lowered (with a warning) so that the connections and the server's own files fit
/// the process's open-files limit (`ulimit -n`).
pub fn connection_cap(requested: usize) -> usize {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return requested;
    };
    if soft == RLIM_INFINITY {
        return requested;
    }
    let room = usize::try_from(soft.saturating_sub(RESERVED_FILES).max(1)).unwrap_or(usize::MAX);
    if requested > room {
        log::warn!(
            "--max-connections {requested}: lowered to {room} (the open-files limit is {soft}, \
             {RESERVED_FILES} of them kept for the server's own files)"
        );
        return room;
    }
    requested
}

/// One open connection, as the cap sees it.
pub struct Connection {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last byte read from or written to the client.
    last_progress_ms: AtomicU64,
    /// Requests on it that have their whole body and are computing or answering.
    busy: AtomicUsize,
    /// Told when the connection is closed to make room.
    close: Notify,
}

impl Connection {
    fn progressed(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_progress_ms.store(ms, Ordering::Relaxed);
    }

    /// Marks the connection as serving a request that needs nothing more from the client, until
    /// the guard is dropped: it is not closed to make room meanwhile.
    pub fn busy(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        BusyGuard(Arc::clone(self))
    }
}

pub struct BusyGuard(Arc<Connection>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open connections.
struct Registry {
    /// Most open at once; lowered when `accept` runs out of files below it.
    cap: AtomicUsize,
    epoch: Instant,
    open: Mutex<(u64, HashMap<u64, Arc<Connection>>)>,
    metrics: Arc<Metrics>,
}

impl Registry {
    /// Registers a new connection, first closing the least active one if the cap is reached;
    /// `None` when every open connection is busy.
    fn admit(&self) -> Option<(u64, Arc<Connection>)> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (next_id, connections) = &mut *open;
        let cap = self.cap.load(Ordering::Relaxed);
        if connections.len() >= cap && !Self::close_least_active(connections, &self.metrics) {
            return None;
        }
        let connection = Arc::new(Connection {
            epoch: self.epoch,
            last_progress_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
            close: Notify::new(),
        });
        connection.progressed();
        let id = *next_id;
        *next_id += 1;
        connections.insert(id, Arc::clone(&connection));
        self.metrics
            .connections_open
            .store(connections.len() as u64, Ordering::Relaxed);
        Some((id, connection))
    }

    /// `accept` found no file descriptor left: lowers the cap below the connections open now
    /// (the files the cap was fitted to were not all there: the open-files limit was lowered
    /// under the running server, or the server's own files took more), so that from now on the
    /// cap makes room before `accept` fails; and frees one descriptor. Whether one was freed.
    fn out_of_files(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let fitting = open.1.len().saturating_sub(1).max(1);
        let cap = self.cap.load(Ordering::Relaxed);
        if fitting < cap {
            self.cap.store(fitting, Ordering::Relaxed);
            log::warn!("out of open files with {} connections: --max-connections lowered from {cap} to {fitting}", open.1.len());
        }
        Self::close_least_active(&mut open.1, &self.metrics)
    }

    fn close_least_active(
        connections: &mut HashMap<u64, Arc<Connection>>,
        metrics: &Metrics,
    ) -> bool {
        let victim = connections
            .iter()
            .filter(|(_, c)| c.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, c)| c.last_progress_ms.load(Ordering::Relaxed))
            .map(|(id, _)| *id);
        let Some(connection) = victim.and_then(|id| connections.remove(&id)) else {
            return false;
        };
        // A stored permit: the connection's task sees it even if it is not waiting yet.
        connection.close.notify_one();
        metrics.connections_shed.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.1.remove(&id);
        self.metrics
            .connections_open
            .store(open.1.len() as u64, Ordering::Relaxed);
    }
}

/// Unregisters its connection when the connection's task ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// A socket that notes every byte that moves on its connection.
struct Tracked {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.connection.progressed();
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.connection.progressed();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.connection.progressed();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The connection limits.
pub struct Limits {
    /// Longest time to receive a request head, counted from the first read of it (for a kept-alive
    /// connection, from the end of the previous answer: so also the idle timeout).
    pub header_timeout: Duration,
    /// Most connections open at once (already fitted to the open-files limit).
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the open connections to
/// finish their requests (each still bounded by the header and body timeouts).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let registry = Arc::new(Registry {
        cap: AtomicUsize::new(limits.max_connections),
        epoch: Instant::now(),
        open: Mutex::new((0, HashMap::new())),
        metrics,
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e, &registry).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some((id, connection)) = registry.admit() else {
            log::warn!("every connection open is computing: closing a new one");
            continue; // dropping the stream closes it
        };
        let registered = Registered {
            registry: Arc::clone(&registry),
            id,
        };
        let io = TokioIo::new(Tracked {
            stream,
            connection: Arc::clone(&connection),
        });
        let router = app.clone();
        let for_requests = Arc::clone(&connection);
        // The handler finds its connection in the request's extensions (to mark it busy).
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(Arc::clone(&for_requests));
            tower::Service::call(&mut router.clone(), request.map(Body::new))
        });
        let served = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            let _registered = registered;
            tokio::select! {
                result = served => {
                    if let Err(e) = result {
                        log::debug!("connection ended: {e}");
                    }
                }
                () = connection.close.notified() => {
                    log::debug!("connection closed to make room for a new one");
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// After an `accept` error: a peer that gave up is nothing; out of file descriptors, lower the
/// cap and close the least active connection; pause so that a lasting error cannot spin.
async fn accept_failed(e: &io::Error, registry: &Registry) {
    use nix::errno::Errno;
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    ) {
        return;
    }
    let out_of_files = e
        .raw_os_error()
        .is_some_and(|code| code == Errno::EMFILE as i32 || code == Errno::ENFILE as i32);
    if out_of_files {
        log::warn!("accept: {e}; closing the least active connection");
        if registry.out_of_files() {
            tokio::time::sleep(ROOM_MADE_PAUSE).await;
            return;
        }
    } else {
        log::error!("accept: {e}");
    }
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}
