//! The keyword arguments of `LlamaModel.new_context`, read into `ContextOptions`.

use llamactx_engine::context_option_list;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::open_context::ContextOptions;

macro_rules! options_from_kwargs {
    ($($name:ident: $ty:ty),* $(,)?) => {
        /// Reads `new_context`'s keyword arguments; an unknown name raises `TypeError`.
        pub(crate) fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<ContextOptions> {
            let mut options = ContextOptions::default();
            let Some(kwargs) = kwargs else { return Ok(options) };
            for (key, value) in kwargs.iter() {
                let key: String = key.extract()?;
                match key.as_str() {
                    $(stringify!($name) => {
                        options.$name = value.extract().map_err(|err| argument_error(&key, &err))?;
                    })*
                    _ => {
                        return Err(PyTypeError::new_err(format!(
                            "new_context() got an unexpected keyword argument '{key}'; it takes {}",
                            ContextOptions::NAMES.join(", ")
                        )))
                    }
                }
            }
            Ok(options)
        }
    };
}
context_option_list!(options_from_kwargs);

/// The extraction error with the argument's name, keeping its class (`TypeError`,
/// `OverflowError`) as PyO3's own argument errors do.
fn argument_error(name: &str, err: &PyErr) -> PyErr {
    Python::attach(|py| {
        let message = format!("argument '{name}': {}", err.value(py));
        match err.get_type(py).call1((message,)) {
            Ok(exception) => PyErr::from_value(exception),
            Err(failed) => failed,
        }
    })
}
