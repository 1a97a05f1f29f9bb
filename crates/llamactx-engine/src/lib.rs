//! llamactx's engine core: continuous batching over one llama.cpp context (`engine`), with
//! speculative drafts, the prefix cache and media prompts, on a context made safe to call
//! (`open_context`), the samplers and the model's checks, all without Python. The `llamactx`
//! extension is its Python bindings; `engine` is the API for Rust programs (see
//! `examples/engine_stream.rs` beside this crate).

// Every module is public for the extension, which documents what each call raises where Python
// meets it (docs/api.md); the engine's own Rust API (`Engine`, `RequestShared`) says its errors.
#![allow(
    clippy::missing_errors_doc,
    clippy::must_use_candidate,
    clippy::return_self_not_must_use
)]
#![allow(clippy::missing_panics_doc)]

pub mod backend;
pub mod batch;
pub mod cpu_budget;
pub mod engine;
pub mod errors;
pub mod interrupt;
pub mod lora;
pub mod media;
pub mod metadata;
pub mod model;
pub mod open_context;
pub mod owned_lock;
pub mod prompt_checks;
pub mod rpc;
pub mod sampler;
pub mod shared_pool;
pub mod steps;
pub mod threadpool;
pub mod tokens;
