//! The abort callback as Python gives it: a callable, called with the GIL while llama.cpp
//! computes (`open_context/abort.rs` polls it).

use std::any::Any;

use pyo3::prelude::*;

use crate::errors::python::foreign;
use crate::errors::Error;
use crate::open_context::abort::AbortCheck;

/// A Python callable: a true result asks to abort; an exception aborts and is raised again.
pub struct PythonAbortCheck(pub Py<PyAny>);

impl AbortCheck for PythonAbortCheck {
    fn should_abort(&self) -> Result<bool, Error> {
        Python::attach(|py| {
            self.0
                .call0(py)
                .and_then(|answer| answer.is_truthy(py))
                .map_err(foreign)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
