//! A loopback relay between llama.cpp's RPC client and one RPC server.
//!
//! ggml-rpc aborts the process when its server is unreachable, speaks another protocol version,
//! or drops the connection (`RPC_STATUS_ASSERT`, `GGML_ABORT`). llama.cpp therefore talks to this
//! relay, which passes every message on to the server and, the moment the server fails, records
//! why and answers the client's remaining requests itself with stand-in answers of the right
//! size. llama.cpp finishes the decode it was in; llamactx then raises the recorded failure and
//! refuses further work on the model (see `ModelLinks::check`).

use std::io::{self, BufReader, BufWriter};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::protocol::{self, Request};

/// What the relay knows of its server.
pub struct LinkState {
    pub endpoint: String,
    timeout: Duration,
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    /// Bytes the client allocated on the server (model weights, KV cache, compute buffers).
    pub allocated: AtomicU64,
}

impl LinkState {
    fn fail(&self, reason: String) {
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert(reason);
        }
        self.failed.store(true, Ordering::Release);
    }

    /// Why the server is unusable, if it is.
    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let failure = self.failure.lock().ok().and_then(|failure| failure.clone());
        Some(failure.unwrap_or_else(|| "the connection failed".to_owned()))
    }
}

/// A listening relay; dropping it stops accepting (open connections run until llama.cpp closes
/// them, which it does when the model and its contexts are freed).
pub struct Relay {
    pub address: SocketAddr,
    pub state: Arc<LinkState>,
    stopping: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(endpoint: &str, timeout: Duration) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let address = listener.local_addr()?;
        let state = Arc::new(LinkState {
            endpoint: endpoint.to_owned(),
            timeout,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            allocated: AtomicU64::new(0),
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let (accepting, stop) = (Arc::clone(&state), Arc::clone(&stopping));
        thread::Builder::new()
            .name("llamactx-rpc-relay".to_owned())
            .spawn(move || accept(&listener, &accepting, &stop))?;
        Ok(Self {
            address,
            state,
            stopping,
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wakes the blocking accept so that its thread sees the flag and ends.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
    }
}

fn accept(listener: &TcpListener, state: &Arc<LinkState>, stopping: &AtomicBool) {
    for client in listener.incoming() {
        if stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = client else { continue };
        serve_on_a_thread(client, Arc::clone(state));
    }
}

/// Serves `client` on a thread of its own or, when none can be started, on this one: a dropped
/// connection would make ggml-rpc abort.
fn serve_on_a_thread(client: TcpStream, state: Arc<LinkState>) {
    let handoff = Arc::new(Mutex::new(Some(client)));
    let (theirs, their_state) = (Arc::clone(&handoff), Arc::clone(&state));
    let spawned = thread::Builder::new()
        .name("llamactx-rpc-relay".to_owned())
        .spawn(move || {
            if let Some(client) = theirs.lock().ok().and_then(|mut slot| slot.take()) {
                serve(client, &their_state);
            }
        });
    if spawned.is_err() {
        if let Some(client) = handoff.lock().ok().and_then(|mut slot| slot.take()) {
            serve(client, &state);
        }
    }
}

/// Relays one client connection until the client closes it.
fn serve(client: TcpStream, state: &LinkState) {
    let _ = client.set_nodelay(true);
    let mut from_client = BufReader::new(&client);
    let mut to_client = BufWriter::new(&client);
    let mut server = if state.failure().is_none() {
        connect(&state.endpoint, state.timeout)
            .map_err(|err| state.fail(err))
            .ok()
    } else {
        None
    };
    while let Ok(Some(mut request)) = Request::read(&mut from_client) {
        request.clear_capabilities();
        let answer_size = request.answer_size();
        if state.failure().is_some() {
            // Never mix a failed server's answers with stand-ins on one connection.
            if let Some(upstream) = server.take() {
                upstream.close();
            }
        }
        let relayed = server
            .as_mut()
            .map(|upstream| upstream.relay(&request, answer_size, state));
        let answer = match relayed {
            Some(Ok(answer)) => answer,
            Some(Err(reason)) => {
                state.fail(reason);
                answer_size.map(|size| request.stand_in_answer(size))
            }
            None => answer_size.map(|size| request.stand_in_answer(size)),
        };
        if let Some(answer) = answer {
            if protocol::write_answer(&mut to_client, &answer).is_err() {
                break;
            }
        }
    }
    if let Some(upstream) = server {
        upstream.close();
    }
}

struct Upstream {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Upstream {
    /// Passes `request` on and returns the server's answer, if the command has one (`Ok(None)`
    /// when it has none), or why the server failed.
    fn relay(
        &mut self,
        request: &Request,
        answer_size: Option<u64>,
        state: &LinkState,
    ) -> Result<Option<Vec<u8>>, String> {
        let lost = |err: io::Error| describe(&err, state.timeout);
        request.write(&mut self.writer).map_err(lost)?;
        let Some(size) = answer_size else { return Ok(None) };
        let mut answer = protocol::read_answer(&mut self.reader, size).map_err(lost)?;
        if let Some(refusal) = request.refuse_answer(&answer) {
            return Err(refusal);
        }
        match request.command {
            protocol::HELLO => {
                let version = protocol::hello_version(&mut answer);
                if !protocol::compatible(version) {
                    return Err(version_mismatch(version));
                }
            }
            // rpc_msg_alloc_buffer_rsp: remote_ptr, remote_size.
            protocol::ALLOC_BUFFER => {
                let size = answer
                    .get(8..16)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes);
                state.allocated.fetch_add(size, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(Some(answer))
    }

    fn close(self) {
        let _ = self.writer.get_ref().shutdown(Shutdown::Both);
    }
}

/// Connects to `endpoint` with `timeout` for the connection and for every awaited answer.
fn connect(endpoint: &str, timeout: Duration) -> Result<Upstream, String> {
    let unreachable = |reason: &dyn std::fmt::Display| format!("cannot connect: {reason}");
    let addresses: Vec<SocketAddr> = endpoint.to_socket_addrs().map_err(|err| unreachable(&err))?.collect();
    let mut last = None;
    for address in addresses {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                stream
                    .set_read_timeout(Some(timeout))
                    .map_err(|err| unreachable(&err))?;
                stream
                    .set_write_timeout(Some(timeout))
                    .map_err(|err| unreachable(&err))?;
                let writer = stream.try_clone().map_err(|err| unreachable(&err))?;
                return Ok(Upstream {
                    reader: BufReader::new(stream),
                    writer: BufWriter::new(writer),
                });
            }
            Err(err) => last = Some(err),
        }
    }
    Err(match last {
        Some(err) => unreachable(&describe(&err, timeout)),
        None => unreachable(&"the name resolves to no address"),
    })
}

/// Greets the server at `endpoint` as ggml-rpc would, so that an unreachable server, one of
/// another protocol version or one busy with another client is an error before llama.cpp
/// connects (where each would abort). Returns the server's protocol version.
pub fn handshake(endpoint: &str, timeout: Duration) -> Result<(u8, u8, u8), String> {
    let mut server = connect(endpoint, timeout)?;
    let hello = Request {
        command: protocol::HELLO,
        payload: vec![0; protocol::HELLO_REQUEST_SIZE],
    };
    let answer = hello
        .write(&mut server.writer)
        .and_then(|()| protocol::read_answer(&mut server.reader, protocol::HELLO_ANSWER_SIZE as u64));
    server.close();
    let mut answer = answer.map_err(|err| match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "no answer to the handshake within {:.0} s: an RPC server serves one client at a time, \
             and another may be connected",
            timeout.as_secs_f64()
        ),
        _ => format!("the handshake failed ({err}): is this an llama.cpp RPC server?"),
    })?;
    let version = protocol::hello_version(&mut answer);
    if protocol::compatible(version) {
        Ok(version)
    } else {
        Err(version_mismatch(version))
    }
}

fn version_mismatch((major, minor, patch): (u8, u8, u8)) -> String {
    let (ours_major, ours_minor, ours_patch) = protocol::VERSION;
    format!(
        "the server speaks RPC protocol {major}.{minor}.{patch}, this build of llamactx \
         {ours_major}.{ours_minor}.{ours_patch}: run the rpc-server of the same llamactx version"
    )
}

fn describe(err: &io::Error, timeout: Duration) -> String {
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("the server did not answer within {:.0} s", timeout.as_secs_f64())
        }
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            "the server closed the connection (stopped or crashed)".to_owned()
        }
        _ => err.to_string(),
    }
}
