//! The native module `llamactx._llamactx`: registers classes and exceptions, nothing else.

mod arrays;
mod backend;
mod batch;
mod context;
mod errors;
mod metadata;
mod model;
mod native;
mod paths;
mod sampler;
mod tokens;

use pyo3::prelude::*;

#[pymodule]
fn _llamactx(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<model::PyLlamaModel>()?;
    m.add_class::<context::PyLlamaContext>()?;
    m.add_class::<batch::PyLlamaBatch>()?;
    m.add_class::<sampler::PyLlamaSampler>()?;
    Ok(())
}
