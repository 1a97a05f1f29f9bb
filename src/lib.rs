//! The native module `llamactx._llamactx`: registers classes and exceptions. It is the Python
//! binding of the engine core, `crates/llamactx-engine`, which Rust programs use directly.

mod arrays;
mod chat_format;
mod closing;
mod context;
mod cpu;
mod gil;
mod paths;
mod perf;
mod regex_search;
mod rerank;
mod token_data;
mod work_limit;

// The engine core (`crates/llamactx-engine`), each module with the Python classes of its types
// beside it: the `python` modules here wrap the core's types, which these modules re-export.
use llamactx_engine::{interrupt, metadata, open_context, owned_lock};

mod errors {
    pub use llamactx_engine::errors::*;
    pub mod python;
}

mod backend {
    pub use llamactx_engine::backend::*;
    pub mod python;
}
mod batch {
    pub use llamactx_engine::batch::*;
    pub mod python;
}
mod engine {
    pub use llamactx_engine::engine::*;
    pub mod python;
    pub mod request {
        pub use llamactx_engine::engine::request::*;
        pub mod python;
    }
}
mod lora {
    pub use llamactx_engine::lora::*;
    pub mod python;
}
mod media {
    pub use llamactx_engine::media::*;
    pub mod python;
}
mod model {
    pub use llamactx_engine::model::*;
    pub mod python;
}
mod prompt_checks {
    pub use llamactx_engine::prompt_checks::*;
    pub mod python;
}
mod rpc {
    pub use llamactx_engine::rpc::*;
    pub mod python;
}
mod sampler {
    pub use llamactx_engine::sampler::*;
    pub mod python;
    pub mod params {
        pub use llamactx_engine::sampler::params::*;
        pub mod python;
    }
}
mod threadpool {
    pub use llamactx_engine::threadpool::*;
    pub mod python;
}
mod tokens {
    pub use llamactx_engine::tokens::*;
    pub mod python;
}

use pyo3::prelude::*;

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
    m.add_function(wrap_pyfunction!(sampler::python::check_constraint_size, m)?)?;
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
