//! llama.cpp's RPC backend: a model's layers on the devices of RPC servers (other machines, or
//! other processes), each reached through a relay that turns the server's failures into
//! errors instead of ggml-rpc's aborts.

pub mod protocol;
pub mod relay;

use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use llama_cpp_4::model::params::LlamaModelParams;
use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::LlamaModelLoadError;
use llama_cpp_sys_4::ggml_backend_device;

use crate::backend::explained;
use crate::errors::{Error, ExcClass, Result};
use relay::Relay;

/// A device of the ggml registry. ggml-rpc allocates them when a server is added and never
/// frees them, so the pointer stays valid for the life of the process.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Device(NonNull<ggml_backend_device>);

// SAFETY: the device is immutable, process-lived registry data that ggml reads from any thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// One RPC server a model uses: the relay in front of it and the devices it exposes.
struct Link {
    relay: Relay,
    devices: Vec<Device>,
    /// Bytes of the model's weights the loader placed on the server.
    weights: std::sync::atomic::AtomicU64,
}

/// The RPC servers of one model, in the order the user listed them (llama.cpp fills them first).
pub struct ModelLinks {
    links: Vec<Link>,
}

/// Where a part of a model went: a device and the weight bytes placed on it.
pub struct Placement {
    pub name: String,
    pub kind: &'static str,
    pub endpoint: Option<String>,
    pub weight_bytes: Option<u64>,
}

/// An `RpcError` naming `endpoint`.
pub fn error(kind: &str, endpoint: &str, reason: &str) -> Error {
    Error::llama(
        ExcClass::RpcError,
        kind,
        None,
        format!("RPC server {endpoint}: {reason}"),
    )
}

/// Checks `endpoint` is `host:port`, the form llama.cpp's tools take.
fn check_endpoint(endpoint: &str) -> Result<()> {
    let valid = endpoint.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !endpoint.contains('\0') && port.parse::<u16>().is_ok_and(|port| port > 0)
    });
    if valid {
        Ok(())
    } else {
        Err(error(
            "InvalidEndpoint",
            endpoint,
            "expected host:port, e.g. 192.168.1.20:50052",
        ))
    }
}

impl ModelLinks {
    /// Greets every server, then puts a relay in front of each and asks llama.cpp (through it)
    /// for the server's devices. `timeout` bounds every connection and every awaited answer.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::value("rpc_servers is empty: give at least one host:port"));
        }
        for (index, endpoint) in endpoints.iter().enumerate() {
            check_endpoint(endpoint)?;
            if endpoints[..index].contains(endpoint) {
                return Err(error("InvalidEndpoint", endpoint, "listed twice"));
            }
        }
        for endpoint in endpoints {
            relay::handshake(endpoint, timeout).map_err(|reason| error("ConnectionFailed", endpoint, &reason))?;
        }
        let links = endpoints
            .iter()
            .map(|endpoint| Link::open(endpoint, timeout))
            .collect::<Result<Vec<_>>>()?;
        let links = Self { links };
        links.check()?;
        Ok(links)
    }

    /// The first failure of any server, as an `RpcError`: the model's remote weights and caches
    /// are gone, so nothing computed on it since can be trusted.
    pub fn check(&self) -> Result<()> {
        for link in &self.links {
            if let Some(reason) = link.relay.state.failure() {
                return Err(error("ConnectionFailed", &link.relay.state.endpoint, &reason));
            }
        }
        Ok(())
    }

    /// The devices of every server, null-terminated, for `llama_model_params.devices`, which
    /// llama.cpp offloads to in this order [llama.cpp internal].
    fn device_list(&self) -> Vec<*mut ggml_backend_device> {
        let devices = self
            .links
            .iter()
            .flat_map(|link| link.devices.iter().map(|device| device.0.as_ptr()));
        devices.chain(std::iter::once(std::ptr::null_mut())).collect()
    }

    /// Loads the model at `path` with its layers on these servers' devices (the rest, such as
    /// the token embeddings, stays on this machine's CPU).
    pub fn load(&self, path: &Path, params: &LlamaModelParams) -> Result<LlamaModel> {
        let path = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| Error::value("the model path holds a NUL byte"))?;
        let mut devices = self.device_list();
        // SAFETY: returns a plain struct of defaults.
        let mut raw = unsafe { llama_cpp_sys_4::llama_model_default_params() };
        raw.n_gpu_layers = params.n_gpu_layers();
        raw.main_gpu = params.main_gpu();
        raw.vocab_only = params.vocab_only();
        raw.load_mode = params.load_mode() as llama_cpp_sys_4::llama_load_mode;
        raw.devices = devices.as_mut_ptr();
        let model = explained(|| {
            // SAFETY: `path` and `devices` outlive the call (llama.cpp copies the device list),
            // and every device is a live registry entry.
            let loaded = unsafe { llama_cpp_sys_4::llama_model_load_from_file(path.as_ptr(), raw) };
            NonNull::new(loaded).ok_or(LlamaModelLoadError::NullResult)
        })?;
        // SAFETY: `LlamaModel` is `#[repr(transparent)]` over `NonNull<llama_model>` and frees the
        // model on drop; this pointer is a model just loaded and owned by nothing else. The crate
        // has no way to pass `devices` (llama-cpp-4 0.11), hence this construction.
        let model = unsafe { std::mem::transmute::<NonNull<llama_cpp_sys_4::llama_model>, LlamaModel>(model) };
        self.check()?;
        for link in &self.links {
            let allocated = link.relay.state.allocated.load(Ordering::Relaxed);
            link.weights.store(allocated, Ordering::Relaxed);
        }
        Ok(model)
    }
}

/// Where the weights of a model went: the bytes the loader allocated on each of its servers,
/// then this machine's CPU, whose share llama.cpp does not report for a split model (`None`).
pub fn placements(links: Option<&ModelLinks>, model_size: u64) -> Vec<Placement> {
    let mut placements: Vec<Placement> = links
        .into_iter()
        .flat_map(|links| &links.links)
        .map(|link| Placement {
            name: link
                .devices
                .iter()
                .map(|device| device_name(*device))
                .collect::<Vec<_>>()
                .join(","),
            kind: "rpc",
            endpoint: Some(link.relay.state.endpoint.clone()),
            weight_bytes: Some(link.weights.load(Ordering::Relaxed)),
        })
        .collect();
    placements.push(Placement {
        name: "CPU".to_owned(),
        kind: "cpu",
        endpoint: None,
        weight_bytes: links.is_none().then_some(model_size),
    });
    placements
}

/// `rpc_timeout` in seconds, checked.
pub fn timeout(seconds: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .ok_or_else(|| {
            Error::value(format!(
                "rpc_timeout must be a positive number of seconds, got {seconds}"
            ))
        })
}

impl Link {
    fn open(endpoint: &str, timeout: Duration) -> Result<Self> {
        let relay = Relay::start(endpoint, timeout)
            .map_err(|err| error("ConnectionFailed", endpoint, &format!("cannot start its relay: {err}")))?;
        let address = CString::new(relay.address.to_string()).map_err(|_| Error::value("relay address"))?;
        // SAFETY: `address` outlives the call; ggml copies it. The relay answers even when the
        // server has failed, so ggml-rpc's connection and device count cannot abort.
        let registration = unsafe { llama_cpp_sys_4::ggml_backend_rpc_add_server(address.as_ptr()) };
        let registration = NonNull::new(registration).ok_or_else(|| {
            relay.state.failure().map_or_else(
                || error("ServerError", endpoint, "the server exposes no device"),
                |reason| error("ConnectionFailed", endpoint, &reason),
            )
        })?;
        // SAFETY: a live registration; its device list is fixed once added.
        let count = unsafe { llama_cpp_sys_4::ggml_backend_reg_dev_count(registration.as_ptr()) };
        let devices = (0..count)
            // SAFETY: `index` is below the registration's device count.
            .filter_map(|index| {
                NonNull::new(unsafe { llama_cpp_sys_4::ggml_backend_reg_dev_get(registration.as_ptr(), index) })
            })
            .map(Device)
            .collect();
        Ok(Self {
            relay,
            devices,
            weights: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

fn device_name(device: Device) -> String {
    // SAFETY: a live registry device; ggml returns a string it owns for the device's life.
    let name = unsafe { llama_cpp_sys_4::ggml_backend_dev_name(device.0.as_ptr()) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, owned by the device.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// The links of every model loaded with RPC servers, found by the model's address. Contexts
/// look theirs up here; an entry goes once its model has been freed (and with it llama.cpp's
/// last use of the relays).
static REGISTRY: Mutex<Vec<(Weak<LlamaModel>, Arc<ModelLinks>)>> = Mutex::new(Vec::new());

/// Records that `model` computes through `links`.
pub fn attach(model: &Arc<LlamaModel>, links: Arc<ModelLinks>) {
    if let Ok(mut registry) = REGISTRY.lock() {
        registry.retain(|(model, _)| model.strong_count() > 0);
        registry.push((Arc::downgrade(model), links));
    }
}

/// The links of `model`, if it was loaded with RPC servers.
pub fn links_of(model: &Arc<LlamaModel>) -> Option<Arc<ModelLinks>> {
    let registry = REGISTRY.lock().ok()?;
    registry
        .iter()
        .find(|(entry, _)| std::ptr::eq(entry.as_ptr(), Arc::as_ptr(model)))
        .map(|(_, links)| Arc::clone(links))
}
