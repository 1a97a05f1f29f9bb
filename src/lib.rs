//! The native module `llamactx._llamactx`: registers classes and exceptions; and, for Rust
//! programs, the engine without Python (`engine_api`).

mod arrays;
mod backend;
mod batch;
mod chat_format;
mod context;
mod cpu;
mod cpu_budget;
mod engine;
mod errors;
mod gil;
mod interrupt;
mod lora;
mod media;
mod metadata;
mod model;
mod open_context;
mod owned_lock;
mod paths;
mod perf;
mod prompt_checks;
mod regex_search;
mod rerank;
mod rpc;
mod sampler;
mod shared_pool;
mod steps;
mod threadpool;
mod token_data;
mod tokens;
mod work_limit;

use pyo3::prelude::*;

/// The engine from Rust: the one `llamactx.Engine` wraps, used without Python. Load a model
/// with `load_checked`, `Engine::start` an engine on it, `submit_tokens` prompts (token ids,
/// from the model's `str_to_token`), read each request's text as it comes
/// (`Request::next_text`, from any thread) and then its `Completion` (`Request::ended`), and
/// `stop` the engine. `examples/engine_stream.rs` streams concurrent requests this way.
pub mod engine_api {
    pub use crate::context::ContextOptions;
    pub use crate::engine::{
        Completion, Constraint, DraftChoice, Engine, EngineSettings, EngineStats, NgramConfig,
        RequestShared as Request, Submission,
    };
    pub use crate::errors::Error;
    pub use crate::model::load_checked;
    pub use crate::sampler::params::SamplingParams;
}

#[pymodule]
fn _llamactx(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Whether llama.cpp was compiled for the building machine (-march=native), not a CPU level.
    m.add("NATIVE_BUILD", cfg!(feature = "native"))?;
    errors::python::register(m)?;
    m.add_class::<model::python::PyLlamaModel>()?;
    m.add_class::<context::PyLlamaContext>()?;
    m.add_class::<batch::python::PyLlamaBatch>()?;
    m.add_class::<sampler::python::PyLlamaSampler>()?;
    m.add_class::<token_data::PyLlamaTokenData>()?;
    m.add_class::<token_data::PyLlamaTokenDataArray>()?;
    m.add_class::<lora::python::PyLlamaLoraAdapter>()?;
    m.add_class::<threadpool::python::PyThreadPool>()?;
    m.add_class::<perf::PyPerfContextData>()?;
    m.add_class::<sampler::params::python::PySamplingParams>()?;
    m.add_class::<engine::python::PyCompletion>()?;
    m.add_class::<engine::python::PyEngineCore>()?;
    m.add_class::<engine::python::PyEngineStats>()?;
    m.add_class::<engine::python::PyRequestCore>()?;
    m.add_class::<engine::python::PyWaker>()?;
    m.add_class::<engine::python::PyContextLoop>()?;
    m.add_class::<regex_search::PyRegex>()?;
    m.add_class::<chat_format::PyChatTemplates>()?;
    m.add_class::<chat_format::PyChatApplied>()?;
    m.add_class::<media::python::PyMtmdContext>()?;
    m.add_class::<media::python::PyMtmdBitmap>()?;
    m.add_class::<media::python::PyMtmdInputChunks>()?;
    m.add_class::<media::python::PyMtmdInputChunk>()?;
    m.add_function(wrap_pyfunction!(rpc::python::serve_rpc, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(prompt_checks::python::check_prompt, m)?)?;
    m.add_function(wrap_pyfunction!(prompt_checks::python::check_media_ending, m)?)?;
    m.add_function(wrap_pyfunction!(
        engine::python::speculative_options::check_speculative,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(chat_format::check_reasoning, m)?)?;
    m.add_function(wrap_pyfunction!(chat_format::check_template_variables, m)?)?;
    m.add_function(wrap_pyfunction!(backend::python::gpu_devices, m)?)?;
    m.add_function(wrap_pyfunction!(tokens::python::vocabulary_ids, m)?)?;
    m.add_function(wrap_pyfunction!(rerank::rerank_prompt, m)?)?;
    m.add("_MAX_NGRAM", engine::python::speculative_options::MAX_NGRAM)?;
    m.add("_MAX_DRAFT", engine::python::speculative_options::MAX_DRAFT)?;
    m.add("_REASONING_FORMATS", chat_format::reasoning_format_names())?;
    Ok(())
}
