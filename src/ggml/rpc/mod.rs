//! ggml's RPC backend: a remote device reached over TCP, and the server that offers one.
//!
//! ggml's client aborts the process when a server is unreachable, so every client entry
//! point here probes the TCP endpoint first. The protocol has no authentication: serve on
//! loopback unless the network is trusted.
//!
//! What cannot be made survivable in-process: once connected, ggml's client aborts the whole
//! process (`GGML_ABORT("Remote RPC server crashed or returned malformed response")`, SIGABRT)
//! when the server dies or the connection closes mid-run, and waits forever when the server
//! stops answering (a stopped or hung server). That code is C++ inside ggml; a Rust caller
//! cannot catch the abort. So:
//! - [`Device::rpc_with_answer_timeout`] relays the connection through a local
//!   [`relay`] that closes it when the server owes an answer and sends
//!   nothing for the timeout: a hang becomes the same abort as a dead server;
//! - a computation that must survive either runs in a child process, and the parent reads
//!   the child's exit status (what `da3 repro` does for its unchecked run);
//! - set `GGML_NO_BACKTRACE=1` (the `da3` command does) or ggml's abort handler forks gdb
//!   to print a backtrace first.

pub mod relay;

use super::backend::{cstring, Device};
use super::error::{Error, Result};
use ggml_sys as sys;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ptr::NonNull;
use std::time::Duration;

/// Resolves `host:port`.
fn resolve(endpoint: &str) -> Result<SocketAddr> {
    let unreachable = |source| Error::RpcUnreachable {
        endpoint: endpoint.to_owned(),
        source,
    };
    endpoint
        .to_socket_addrs()
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the name resolves to no address",
            ))
        })
}

/// Checks that something accepts TCP connections at `endpoint` within `timeout`.
pub fn probe(endpoint: &str, timeout: Duration) -> Result<()> {
    let addr = resolve(endpoint)?;
    TcpStream::connect_timeout(&addr, timeout)
        .map(drop)
        .map_err(|source| Error::RpcUnreachable {
            endpoint: endpoint.to_owned(),
            source,
        })
}

/// ggml 0.26.0's RPC protocol: `RPC_PROTO_MAJOR_VERSION`, `RPC_PROTO_MINOR_VERSION`.
const PROTOCOL: (u8, u8) = (7, 0);
/// `RPC_CMD_HELLO` and `sizeof(rpc_msg_hello_req)`, `sizeof(rpc_msg_hello_rsp)`.
const HELLO: (u8, usize, usize) = (14, 24, 28);

/// Does the HELLO exchange ggml's client does on connecting, whose failure it answers with an
/// abort: a server that closes the connection instead (`da3 rpc-server` at its connection
/// limit, a worker that failed to start), answers garbage or speaks another protocol version.
pub fn handshake(endpoint: &str, timeout: Duration) -> Result<()> {
    use std::io::{Read as _, Write as _};
    let addr = resolve(endpoint)?;
    let unreachable = |source| Error::RpcUnreachable {
        endpoint: endpoint.to_owned(),
        source,
    };
    let refused = |reason: String| Error::RpcHandshake {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(unreachable)?;
    s.set_read_timeout(Some(timeout)).map_err(unreachable)?;
    s.set_write_timeout(Some(timeout)).map_err(unreachable)?;
    let (cmd, req_size, rsp_size) = HELLO;
    let mut msg = vec![cmd];
    msg.extend((req_size as u64).to_le_bytes());
    // conn_caps all zero: plain TCP, as a client that offers no other transport.
    msg.resize(9 + req_size, 0);
    s.write_all(&msg).map_err(unreachable)?;
    let mut size = [0u8; 8];
    s.read_exact(&mut size).map_err(|e| {
        refused(match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                "it closed the connection without answering HELLO (a `da3 rpc-server` at its \
                 --max-connections limit, or not a ggml RPC server)"
                    .into()
            }
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("no answer to HELLO within {timeout:?}")
            }
            _ => format!("reading its answer to HELLO: {e}"),
        })
    })?;
    let size = u64::from_le_bytes(size);
    if size != rsp_size as u64 {
        return Err(refused(format!(
            "its answer to HELLO has {size} bytes, not {rsp_size} (not a ggml RPC server?)"
        )));
    }
    let mut rsp = vec![0u8; rsp_size];
    s.read_exact(&mut rsp)
        .map_err(|e| refused(format!("reading its answer to HELLO: {e}")))?;
    let (major, minor, patch) = (rsp[0], rsp[1], rsp[2]);
    if major != PROTOCOL.0 || minor > PROTOCOL.1 {
        return Err(refused(format!(
            "it speaks RPC protocol {major}.{minor}.{patch}; this build's ggml speaks {}.{}",
            PROTOCOL.0, PROTOCOL.1
        )));
    }
    Ok(())
}

impl Device {
    /// The first device an RPC server at `endpoint` ("host:port") offers. Fails with
    /// [`Error::RpcUnreachable`] instead of letting ggml abort when nothing listens there, and
    /// with [`Error::RpcHandshake`] when the server does not complete ggml's HELLO (a busy
    /// `da3 rpc-server`, another protocol version). A server that fails between this check and
    /// ggml's own connection still makes ggml abort: see the module documentation.
    pub fn rpc(endpoint: &str) -> Result<Device> {
        handshake(endpoint, Duration::from_secs(10))?;
        let c_endpoint = cstring("RPC endpoint", endpoint)?;
        // SAFETY: the endpoint answered HELLO; ggml caches one registry per endpoint and
        // returns NULL when the server reports no devices.
        let reg = unsafe { sys::ggml_backend_rpc_add_server(c_endpoint.as_ptr()) };
        let reg = NonNull::new(reg).ok_or_else(|| Error::BackendInit {
            name: format!("RPC[{endpoint}]"),
            reason: "the server offers no devices".into(),
        })?;
        // SAFETY: the registry has at least one device (add_server returns NULL otherwise).
        let dev = unsafe { sys::ggml_backend_reg_dev_get(reg.as_ptr(), 0) };
        NonNull::new(dev)
            .map(Device::from_raw)
            .ok_or_else(|| Error::BackendInit {
                name: format!("RPC[{endpoint}]"),
                reason: "the server's registry has no device 0".into(),
            })
    }
}

impl Device {
    /// Like [`Device::rpc`], through a local relay that closes the connection when the server
    /// owes an answer and sends nothing for `answer_timeout`. ggml's client then aborts the
    /// process (see the module documentation) instead of waiting forever: run the work in a
    /// child process to survive it. The timeout must exceed the longest graph compute, whose
    /// results the next read waits for. The device is named after the relay's loopback port.
    pub fn rpc_with_answer_timeout(endpoint: &str, answer_timeout: Duration) -> Result<Device> {
        probe(endpoint, Duration::from_secs(3))?;
        let local = guard(endpoint, answer_timeout)?;
        Device::rpc(&local)
    }
}

/// The loopback endpoint of a relay to `endpoint` (one per endpoint and timeout, for the
/// life of the process).
fn guard(endpoint: &str, answer_timeout: Duration) -> Result<String> {
    use std::sync::Mutex;
    static GUARDS: Mutex<Vec<(String, Duration, String)>> = Mutex::new(Vec::new());
    let mut guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, local)) = guards
        .iter()
        .find(|(e, t, _)| e == endpoint && *t == answer_timeout)
    {
        return Ok(local.clone());
    }
    let remote = resolve(endpoint)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|source| Error::RpcUnreachable {
        endpoint: "127.0.0.1:0 (local relay)".into(),
        source,
    })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::RpcUnreachable {
            endpoint: "local relay".into(),
            source,
        })?
        .to_string();
    let limits = relay::Limits {
        max_message: u64::MAX,
        idle_timeout: Duration::MAX,
        answer_timeout: Some(answer_timeout),
    };
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let end = relay::relay(
                    conn,
                    || TcpStream::connect_timeout(&remote, Duration::from_secs(10)),
                    limits,
                );
                if matches!(end, relay::RelayEnd::ServerSilent) {
                    log::error!("RPC server {remote} {end}: closing the connection");
                }
            });
        }
    });
    guards.push((endpoint.to_owned(), answer_timeout, local.clone()));
    Ok(local)
}

/// Serves `device` (usually the CPU) to RPC clients at `endpoint`. Blocks for as long as the
/// server runs; returns an error if the address cannot be bound.
pub fn serve(endpoint: &str, device: Device, threads: usize) -> Result<()> {
    let addr = resolve(endpoint)?;
    // ggml only prints when it cannot bind; find out first so the caller gets an error.
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| Error::BackendInit {
            name: format!("RPC server on {endpoint}"),
            reason: format!("cannot listen: {source}"),
        })?;
    let c_endpoint = cstring("RPC endpoint", endpoint)?;
    let mut devices = [device.as_ptr()];
    // SAFETY: valid endpoint string and one registry device; the call serves until the
    // process ends (or returns early on a socket error).
    unsafe {
        sys::ggml_backend_rpc_start_server(
            c_endpoint.as_ptr(),
            std::ptr::null(),
            threads.max(1),
            1,
            devices.as_mut_ptr(),
        )
    };
    Err(Error::BackendInit {
        name: format!("RPC server on {endpoint}"),
        reason: "the serve loop stopped".into(),
    })
}

/// Waits until `endpoint` accepts connections (a server just started elsewhere).
pub fn wait_until_listening(endpoint: &str, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match probe(endpoint, Duration::from_millis(200)) {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// `handshake` against a fake server that reads the HELLO and answers `reply` (then
    /// closes); the error text.
    fn handshake_against(reply: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut hello = [0u8; 9 + HELLO.1];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(hello[0], HELLO.0);
            assert_eq!(u64::from_le_bytes(hello[1..9].try_into().unwrap()), 24);
            s.write_all(&reply).unwrap();
        });
        let err = handshake(&endpoint, Duration::from_secs(5)).unwrap_err();
        server.join().unwrap();
        let text = err.to_string();
        assert!(matches!(err, Error::RpcHandshake { .. }), "{text}");
        assert!(text.contains(&endpoint), "{text}");
        text
    }

    fn answer(major: u8, minor: u8) -> Vec<u8> {
        let mut reply = (HELLO.2 as u64).to_le_bytes().to_vec();
        reply.extend([major, minor, 0, 0]);
        reply.resize(8 + HELLO.2, 0);
        reply
    }

    #[test]
    fn servers_that_fail_the_hello_are_errors_naming_why() {
        let closed = handshake_against(Vec::new());
        assert!(closed.contains("without answering HELLO"), "{closed}");
        assert!(closed.contains("--max-connections"), "{closed}");
        let mut short = 4u64.to_le_bytes().to_vec();
        short.extend([7, 0, 0, 0]);
        let wrong_size = handshake_against(short);
        assert!(wrong_size.contains("4 bytes, not 28"), "{wrong_size}");
        let old = handshake_against(answer(6, 0));
        assert!(old.contains("protocol 6.0.0"), "{old}");
        let newer_minor = handshake_against(answer(7, 1));
        assert!(newer_minor.contains("protocol 7.1.0"), "{newer_minor}");
    }

    #[test]
    fn a_server_of_this_protocol_passes_and_nothing_listening_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut hello = [0u8; 9 + HELLO.1];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&answer(PROTOCOL.0, PROTOCOL.1)).unwrap();
        });
        handshake(&endpoint, Duration::from_secs(5)).unwrap();
        server.join().unwrap();
        // The port of a listener just closed: nothing accepts there.
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let err = handshake(&gone.to_string(), Duration::from_secs(2)).unwrap_err();
        assert!(matches!(err, Error::RpcUnreachable { .. }), "{err}");
    }
}
