//! `serve_rpc`: llama.cpp's RPC server for this machine's devices, in this process, for Python
//! (`llamactx rpc-server`), which waits for it with the GIL released and checks for Ctrl-C.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use llama_cpp_sys_4::ggml_backend_device;
use pyo3::prelude::*;

use super::error;
use crate::backend::backend;
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::threadpool::{available_cpus, check_threads};

/// How long the server may take to listen once its thread runs.
const STARTUP: Duration = Duration::from_secs(10);

/// The devices to serve: this machine's GPUs, or its CPU when it has none (as llama.cpp's
/// `rpc-server` chooses). Devices of other RPC servers are never passed on.
fn local_devices() -> Result<Vec<NonNull<ggml_backend_device>>> {
    backend()?;
    // SAFETY: the registry is initialised by `backend()`; indices are below its count, and
    // every call only reads registry data.
    let devices: Vec<_> = unsafe {
        (0..llama_cpp_sys_4::ggml_backend_dev_count())
            .filter_map(|index| NonNull::new(llama_cpp_sys_4::ggml_backend_dev_get(index)))
            .filter(|device| {
                let kind = llama_cpp_sys_4::ggml_backend_dev_type(device.as_ptr());
                let accelerator = kind == llama_cpp_sys_4::GGML_BACKEND_DEVICE_TYPE_GPU
                    || kind == llama_cpp_sys_4::GGML_BACKEND_DEVICE_TYPE_IGPU;
                let registration = llama_cpp_sys_4::ggml_backend_dev_backend_reg(device.as_ptr());
                accelerator && registration != llama_cpp_sys_4::ggml_backend_rpc_reg()
            })
            .collect()
    };
    if !devices.is_empty() {
        return Ok(devices);
    }
    // SAFETY: as above.
    let cpu = unsafe { llama_cpp_sys_4::ggml_backend_dev_by_type(llama_cpp_sys_4::GGML_BACKEND_DEVICE_TYPE_CPU) };
    NonNull::new(cpu)
        .map(|cpu| vec![cpu])
        .ok_or_else(|| Error::state("NoDevice", "llama.cpp has no device to serve"))
}

/// A device list that may cross to the server's thread.
struct Devices(Vec<NonNull<ggml_backend_device>>);

impl Devices {
    fn into_inner(self) -> Vec<NonNull<ggml_backend_device>> {
        self.0
    }
}

// SAFETY: registry devices live for the process and are only read.
unsafe impl Send for Devices {}

/// Runs llama.cpp's RPC server for this machine's devices on `host:port` and blocks until
/// Ctrl-C (`KeyboardInterrupt`), which ends the call; the server itself stops with the
/// process, which should then end with `os._exit` (as `llamactx rpc-server` does): the C++
/// destructors of a normal exit race the serving thread, which cannot be stopped. `threads`
/// (default: every CPU this process may use) compute for its clients; `cache_dir` keeps tensors
/// clients upload, so that a model's weights cross the network once. `on_ready` is called once
/// the server accepts connections. The protocol has no authentication: listen only on loopback
/// or a trusted network. `RpcError` when the address cannot be listened on.
#[pyfunction]
#[pyo3(signature = (host="127.0.0.1", port=50052, *, threads=None, cache_dir=None, on_ready=None))]
pub fn serve_rpc(
    py: Python<'_>,
    host: &str,
    port: u16,
    threads: Option<i32>,
    cache_dir: Option<PathBuf>,
    on_ready: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let endpoint = format!("{host}:{port}");
    let threads =
        usize::try_from(check_threads("threads", threads.unwrap_or_else(available_cpus)).map_err(to_py)?).unwrap_or(1);
    if endpoint.contains('\0') || port == 0 {
        return Err(to_py(error(
            "InvalidEndpoint",
            &endpoint,
            "expected a host name and a port from 1 to 65535",
        )));
    }
    if let Some(dir) = &cache_dir {
        std::fs::create_dir_all(dir).map_err(|err| {
            to_py(Error::value(format!(
                "cannot create cache_dir {}: {err}",
                dir.display()
            )))
        })?;
    }
    // ggml-rpc only logs a failure to listen; binding first turns it into an error.
    drop(
        TcpListener::bind(&endpoint)
            .map_err(|err| to_py(error("ServerError", &endpoint, &format!("cannot listen: {err}"))))?,
    );
    let devices = Devices(local_devices().map_err(to_py)?);
    let (stopped, stop) = mpsc::channel();
    // Shared with the GIL-free wait below, which needs a `Sync` handle.
    let stop = Mutex::new(stop);
    let served = endpoint.clone();
    thread::Builder::new()
        .name("llamactx-rpc-server".to_owned())
        .spawn(move || {
            let devices = devices.into_inner();
            let outcome = llama_cpp_4::rpc::serve(&served, cache_dir.as_deref(), threads, &devices);
            let _ = stopped.send(outcome);
        })
        .map_err(|err| to_py(Error::Runtime(format!("cannot start the server thread: {err}"))))?;
    let mut ready = false;
    let started = Instant::now();
    loop {
        let waited = detached(py, || {
            let stop = stop.lock().map_err(|_| Error::Poisoned("the RPC server's channel"))?;
            Ok(stop.recv_timeout(Duration::from_millis(100)))
        })?;
        match waited {
            Ok(Err(err)) => return Err(to_py(Error::from(err))),
            Ok(Ok(())) => return Err(to_py(error("ServerError", &endpoint, "the server stopped"))),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(to_py(error("ServerError", &endpoint, "the server thread ended")));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !ready && accepts(&endpoint) {
            ready = true;
            if let Some(on_ready) = &on_ready {
                on_ready.call0()?;
            }
        } else if !ready && started.elapsed() > STARTUP {
            return Err(to_py(error(
                "ServerError",
                &endpoint,
                "the server did not start listening",
            )));
        }
        py.check_signals()?;
    }
}

/// Whether something listens on `endpoint` (the server takes the probe as a client that leaves
/// before its handshake).
fn accepts(endpoint: &str) -> bool {
    endpoint.to_socket_addrs().is_ok_and(|mut addresses| {
        addresses.any(|address| TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok())
    })
}
