//! The Python class `SamplingParams`: a constructor that checks each argument, getters,
//! pickling and `repr`, all generated from `sampling_param_list`.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use llamactx_engine::{sampling_param_list, sampling_params_doc};

use super::{checks, SamplingParams};
use crate::errors::python::to_py;
use crate::model::python::PyLlamaModel;
use crate::sampler::python::PyLlamaSampler;

#[doc = sampling_params_doc!()]
#[pyclass(frozen, module = "llamactx", name = "SamplingParams")]
#[derive(Debug, Clone)]
pub struct PySamplingParams(pub SamplingParams);

macro_rules! python_sampling_params {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $kept:ty = $default:tt, from ($argument:ty) by $check:ident, off $off:expr;
    )*) => {
        #[pymethods]
        impl PySamplingParams {
            #[new]
            #[pyo3(signature = (*, $( $name = $default ),*))]
            #[allow(clippy::too_many_arguments)]
            fn new($( $name: $argument ),*) -> PyResult<Self> {
                Ok(Self(SamplingParams { $( $name: checks::$check(stringify!($name), $name).map_err(to_py)?, )* }))
            }

            $(
                $(#[doc = $doc])*
                #[getter]
                fn $name(&self) -> $kept {
                    self.0.$name.clone()
                }
            )*

            /// Pickling (Ray ships parameters to its workers this way): the keywords that rebuild it.
            fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
                let keywords = PyDict::new(py);
                $( keywords.set_item(stringify!($name), self.0.$name.clone())?; )*
                Ok((PyTuple::empty(py), keywords))
            }

            fn __repr__(&self) -> String {
                let fields = [$( format!("{}={}", stringify!($name), Repr(&self.0.$name)) ),*];
                format!("SamplingParams({})", fields.join(", "))
            }
        }
    };
}
sampling_param_list!(python_sampling_params);

/// A kept value as `repr` shows it: numbers as Rust prints them (0.8, not the f64 of an f32),
/// no seed as Python's None, the biases as a dict.
struct Repr<'a, T>(&'a T);

impl std::fmt::Display for Repr<'_, f32> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::fmt::Display for Repr<'_, i32> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::fmt::Display for Repr<'_, Option<u32>> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(value) => write!(f, "{value}"),
            None => f.write_str("None"),
        }
    }
}

impl std::fmt::Display for Repr<'_, BTreeMap<i32, f32>> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

#[pymethods]
impl PySamplingParams {
    /// These parameters as a `LlamaSampler` chain for `model`, for `generate` and friends (each
    /// call builds a fresh chain: samplers keep state). `ValueError` for a logit bias on a token
    /// the model does not have.
    fn sampler(&self, model: &Bound<'_, PyLlamaModel>) -> PyResult<PyLlamaSampler> {
        let model = model.get().vocabulary().map_err(to_py)?;
        let n_vocab = model.n_vocab();
        self.0.check_vocabulary(n_vocab).map_err(to_py)?;
        Ok(PyLlamaSampler::for_model(self.0.build(n_vocab), model))
    }
}
