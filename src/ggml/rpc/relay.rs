//! A relay for ggml RPC connections that checks the client's framing before ggml sees it.
//!
//! ggml's RPC server trusts its input: a size field of 2^63 throws a C++ exception through
//! Rust (abort), a tensor of dims 2^32-1 trips a `GGML_ASSERT`, malformed graphs dereference
//! NULL, a 4 GiB size makes it zero-fill 4 GiB before reading, and one idle connection blocks
//! every other (it serves one connection at a time). That code cannot be changed from here, so
//! `da3 rpc-server` runs each connection's ggml server in its own worker process and puts this
//! relay in front of it: a message of an unknown command or over the size limit closes the
//! connection before any byte reaches the worker, and a client that sends nothing for the idle
//! timeout while no answer is due is disconnected. What gets through and still crashes ggml
//! kills only that worker, that is, only that connection.
//!
//! Framing (ggml 0.26.0, `ggml-rpc.cpp`, protocol 7.0 over TCP): every client message is
//! `| command (1 byte) | size (u64, little-endian) | payload (size bytes) |`, the first one a
//! HELLO of 24 bytes; some commands are answered `| size (u64) | payload |`.
#![forbid(unsafe_code)]

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// ggml's `RPC_CMD_HELLO`.
pub const CMD_HELLO: u8 = 14;
/// ggml's `RPC_CMD_COUNT`: commands are `0..CMD_COUNT`.
pub const CMD_COUNT: u8 = 19;
/// ggml's `sizeof(rpc_msg_hello_req)` (`RPC_CONN_CAPS_SIZE`).
pub const HELLO_SIZE: u64 = 24;

/// Commands the server answers (`send_msg` in `rpc_serve_client`): ALLOC_BUFFER,
/// GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR,
/// GET_DEVICE_MEMORY, GET_ALLOC_SIZE, HELLO, DEVICE_COUNT.
fn answered(cmd: u8) -> bool {
    matches!(cmd, 0..=3 | 7..=9 | 11 | 13..=15)
}

/// What the relay enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest payload one message may declare.
    pub max_message: u64,
    /// A client that sends nothing for this long while no answer is due is disconnected.
    pub idle_timeout: Duration,
    /// A server that owes an answer and sends nothing for this long is disconnected (for the
    /// client side; `None`: wait as long as it takes).
    pub answer_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message: 1 << 30,
            idle_timeout: Duration::from_secs(300),
            answer_timeout: None,
        }
    }
}

/// Why a relayed connection ended.
#[derive(Debug)]
pub enum RelayEnd {
    /// The client closed the connection.
    ClientClosed,
    /// The server side closed the connection (the worker exited or crashed).
    ServerClosed,
    /// The client was silent for the idle timeout with no answer due.
    Idle,
    /// The server owed an answer and sent nothing for the answer timeout.
    ServerSilent,
    /// The client broke the framing: an unknown command, a size over the limit, no HELLO first.
    Refused(String),
    /// A socket error, or the upstream connection could not be made.
    Io(io::Error),
}

impl std::fmt::Display for RelayEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RelayEnd::ClientClosed => write!(f, "client closed the connection"),
            RelayEnd::ServerClosed => write!(f, "server side closed the connection"),
            RelayEnd::Idle => write!(f, "client idle, disconnected"),
            RelayEnd::ServerSilent => write!(f, "server owed an answer and went silent"),
            RelayEnd::Refused(why) => write!(f, "refused: {why}"),
            RelayEnd::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

/// How often a blocked read wakes up to check the idle clock.
const TICK: Duration = Duration::from_millis(100);

struct Clock {
    start: Instant,
    /// Milliseconds since `start` of the last byte in either direction.
    last: AtomicU64,
    /// An answer is due (an answered command was forwarded and no byte came back since).
    awaiting: AtomicBool,
    /// Which direction stopped first ([`FIRST_NONE`], [`FIRST_CLIENT`], [`FIRST_SERVER`]):
    /// each side shuts the other down when it stops, so the second end says nothing.
    first_end: AtomicU8,
}

const FIRST_NONE: u8 = 0;
const FIRST_CLIENT: u8 = 1;
const FIRST_SERVER: u8 = 2;

impl Clock {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

enum ReadEnd {
    Closed,
    Idle,
    Io(io::Error),
}

/// Fills `buf` from the client, waking every [`TICK`] to check the idle clock.
fn read_full(
    stream: &mut TcpStream,
    buf: &mut [u8],
    clock: &Clock,
    idle: Duration,
) -> Result<(), ReadEnd> {
    let mut done = 0;
    while done < buf.len() {
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(ReadEnd::Closed),
            Ok(n) => {
                done += n;
                clock.touch();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if !clock.awaiting.load(Ordering::Relaxed) && clock.idle_for() >= idle {
                    return Err(ReadEnd::Idle);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadEnd::Io(e)),
        }
    }
    Ok(())
}

fn read_header(
    client: &mut TcpStream,
    clock: &Clock,
    limits: &Limits,
    first: bool,
) -> Result<[u8; 9], RelayEnd> {
    let mut header = [0u8; 9];
    read_full(client, &mut header, clock, limits.idle_timeout).map_err(|e| match e {
        ReadEnd::Closed => RelayEnd::ClientClosed,
        ReadEnd::Idle => RelayEnd::Idle,
        ReadEnd::Io(e) => RelayEnd::Io(e),
    })?;
    let cmd = header[0];
    let size = u64::from_le_bytes(header[1..].try_into().expect("8 bytes"));
    if first && (cmd != CMD_HELLO || size != HELLO_SIZE) {
        return Err(RelayEnd::Refused(format!(
            "the first message must be HELLO of {HELLO_SIZE} bytes, got command {cmd} of {size} bytes"
        )));
    }
    if cmd >= CMD_COUNT {
        return Err(RelayEnd::Refused(format!("unknown command {cmd}")));
    }
    if size > limits.max_message {
        return Err(RelayEnd::Refused(format!(
            "command {cmd} declares {size} bytes, over the limit of {}",
            limits.max_message
        )));
    }
    Ok(header)
}

/// Relays one client connection. Reads and checks the client's HELLO, then calls `connect`
/// for the upstream connection (so that a worker is started only for a client that speaks the
/// protocol), then copies both ways, checking each client message's header. Both sockets are
/// shut down when it returns.
pub fn relay(
    mut client: TcpStream,
    connect: impl FnOnce() -> io::Result<TcpStream>,
    limits: Limits,
) -> RelayEnd {
    let clock = Arc::new(Clock {
        start: Instant::now(),
        last: AtomicU64::new(0),
        awaiting: AtomicBool::new(false),
        first_end: AtomicU8::new(FIRST_NONE),
    });
    let _ = client.set_nodelay(true);
    if let Err(e) = client.set_read_timeout(Some(TICK)) {
        return RelayEnd::Io(e);
    }
    let header = match read_header(&mut client, &clock, &limits, true) {
        Ok(h) => h,
        Err(end) => {
            let _ = client.shutdown(Shutdown::Both);
            return end;
        }
    };
    let mut upstream = match connect() {
        Ok(s) => s,
        Err(e) => {
            let _ = client.shutdown(Shutdown::Both);
            return RelayEnd::Io(e);
        }
    };
    let _ = upstream.set_nodelay(true);
    if limits.answer_timeout.is_some() {
        if let Err(e) = upstream.set_read_timeout(Some(TICK)) {
            return RelayEnd::Io(e);
        }
    }
    let (mut client_w, mut upstream_r) = match (client.try_clone(), upstream.try_clone()) {
        (Ok(c), Ok(u)) => (c, u),
        (Err(e), _) | (_, Err(e)) => return RelayEnd::Io(e),
    };
    // Server -> client: plain copy; any byte back means the due answer is coming.
    let back_clock = clock.clone();
    let back = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let end = loop {
            match upstream_r.read(&mut buf) {
                Ok(0) => break RelayEnd::ServerClosed,
                Ok(n) => {
                    back_clock.awaiting.store(false, Ordering::Relaxed);
                    back_clock.touch();
                    if let Err(e) = client_w.write_all(&buf[..n]) {
                        break RelayEnd::Io(e);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let silent = limits
                        .answer_timeout
                        .is_some_and(|t| back_clock.idle_for() >= t);
                    if back_clock.awaiting.load(Ordering::Relaxed) && silent {
                        break RelayEnd::ServerSilent;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // A reset: the server side died (a crashed worker), as an end of stream.
                Err(_) => break RelayEnd::ServerClosed,
            }
        };
        let _ = back_clock.first_end.compare_exchange(
            FIRST_NONE,
            FIRST_SERVER,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        let _ = client_w.shutdown(Shutdown::Both);
        let _ = upstream_r.shutdown(Shutdown::Both);
        end
    });
    let forward = forward(&mut client, &mut upstream, header, &clock, &limits);
    let _ = clock.first_end.compare_exchange(
        FIRST_NONE,
        FIRST_CLIENT,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let _ = client.shutdown(Shutdown::Both);
    let _ = upstream.shutdown(Shutdown::Both);
    let back = back.join().unwrap_or(RelayEnd::ServerClosed);
    // Whichever side stopped first says why: when the client leaves, the server sees the
    // shutdown and closes too (the ordinary end, not a server failure); when the server closes
    // (a worker refused a message or crashed), the client's read ends after it.
    if clock.first_end.load(Ordering::SeqCst) == FIRST_SERVER {
        back
    } else {
        forward
    }
}

/// Client -> server: header by header, each checked, payloads streamed.
fn forward(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    first: [u8; 9],
    clock: &Clock,
    limits: &Limits,
) -> RelayEnd {
    let mut header = first;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let cmd = header[0];
        let mut left = u64::from_le_bytes(header[1..].try_into().expect("8 bytes"));
        // Before the server can have the whole message, so its answer always clears this.
        if answered(cmd) {
            clock.awaiting.store(true, Ordering::Relaxed);
        }
        // The server side going away shows here first when a message is in flight (a reset
        // on write, before the other direction reads the end): the server's end, not ours.
        if upstream.write_all(&header).is_err() {
            return RelayEnd::ServerClosed;
        }
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            if let Err(e) = read_full(client, &mut buf[..n], clock, limits.idle_timeout) {
                return match e {
                    ReadEnd::Closed => RelayEnd::ClientClosed,
                    ReadEnd::Idle => RelayEnd::Idle,
                    ReadEnd::Io(e) => RelayEnd::Io(e),
                };
            }
            if upstream.write_all(&buf[..n]).is_err() {
                return RelayEnd::ServerClosed;
            }
            left -= n as u64;
        }
        header = match read_header(client, clock, limits, false) {
            Ok(h) => h,
            Err(end) => return end,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn hello() -> Vec<u8> {
        let mut msg = vec![CMD_HELLO];
        msg.extend(HELLO_SIZE.to_le_bytes());
        msg.extend([0u8; HELLO_SIZE as usize]);
        msg
    }

    /// Runs the relay between a client socket and a fake server that answers the HELLO with
    /// four bytes and then either closes at once (`server_leaves`) or waits for EOF.
    fn relay_with(
        server_leaves: bool,
        client: impl FnOnce(TcpStream) + Send + 'static,
    ) -> RelayEnd {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut req = [0u8; 9 + HELLO_SIZE as usize];
            s.read_exact(&mut req).unwrap();
            s.write_all(&4u64.to_le_bytes()).unwrap();
            s.write_all(&[7, 0, 0, 0]).unwrap();
            if !server_leaves {
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        let user = std::thread::spawn(move || client(TcpStream::connect(front_addr).unwrap()));
        let (conn, _) = front.accept().unwrap();
        let end = relay(
            conn,
            || TcpStream::connect(upstream_addr),
            Limits::default(),
        );
        user.join().unwrap();
        server.join().unwrap();
        end
    }

    fn read_answer(s: &mut TcpStream) -> Vec<u8> {
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer).unwrap();
        answer.to_vec()
    }

    #[test]
    fn a_client_that_leaves_ends_as_client_closed() {
        // Reported as a server failure, this kept the supervisor waiting for a worker to die.
        let end = relay_with(false, |mut s| {
            s.write_all(&hello()).unwrap();
            assert_eq!(read_answer(&mut s)[8], 7);
        });
        assert!(matches!(end, RelayEnd::ClientClosed), "{end}");
    }

    #[test]
    fn a_server_that_leaves_ends_as_server_closed() {
        let end = relay_with(true, |mut s| {
            s.write_all(&hello()).unwrap();
            read_answer(&mut s);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
        });
        assert!(matches!(end, RelayEnd::ServerClosed), "{end}");
    }

    #[test]
    fn a_message_over_the_limit_is_refused() {
        let end = relay_with(false, |mut s| {
            s.write_all(&hello()).unwrap();
            read_answer(&mut s);
            let mut big = vec![6u8];
            big.extend((2u64 << 30).to_le_bytes());
            s.write_all(&big).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        });
        assert!(matches!(end, RelayEnd::Refused(_)), "{end}");
    }
}
