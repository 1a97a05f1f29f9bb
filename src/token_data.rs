//! `LlamaTokenData` and `LlamaTokenDataArray`: candidate tokens with their logits and
//! probabilities, as samplers see them.

use std::sync::Mutex;

use llama_cpp_4::token::data::LlamaTokenData;
use llama_cpp_4::token::data_array::LlamaTokenDataArray;
use llama_cpp_4::token::LlamaToken;
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::arrays::f32_vector;
use crate::errors::{Error, Result};

/// One candidate: token `id`, its `logit` and probability `p` (read-only).
#[pyclass(frozen, module = "llamactx", name = "LlamaTokenData")]
pub struct PyLlamaTokenData {
    /// The token id.
    #[pyo3(get)]
    id: i32,
    /// The token's logit.
    #[pyo3(get)]
    logit: f32,
    /// The token's probability (0 until a sampler computes it).
    #[pyo3(get)]
    p: f32,
}

#[pymethods]
impl PyLlamaTokenData {
    fn __repr__(&self) -> String {
        format!("LlamaTokenData(id={}, logit={}, p={})", self.id, self.logit, self.p)
    }
}

/// The candidates of one output row: `len()`, iteration over `LlamaTokenData`, numpy copies
/// `ids`, `logits` and `p`, and what the last sampler applied selected.
#[pyclass(frozen, module = "llamactx", name = "LlamaTokenDataArray")]
pub struct PyLlamaTokenDataArray {
    array: Mutex<LlamaTokenDataArray>,
}

impl PyLlamaTokenDataArray {
    pub fn from_logits(logits: &[f32]) -> Self {
        let data = (0_i32..)
            .zip(logits)
            .map(|(id, &logit)| LlamaTokenData::new(LlamaToken::new(id), logit, 0.0));
        Self {
            array: Mutex::new(LlamaTokenDataArray::from_iter(data, false)),
        }
    }

    pub fn lock(&self) -> Result<std::sync::MutexGuard<'_, LlamaTokenDataArray>> {
        self.array.lock().map_err(|_| Error::Poisoned("LlamaTokenDataArray"))
    }

    /// Runs `work` on the array with the GIL released (sampling may be long on a full vocabulary).
    pub fn with_array<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut LlamaTokenDataArray) -> Result<T> + Send,
    ) -> PyResult<T> {
        crate::gil::detached(py, || work(&mut *self.lock()?))
    }

    fn column<T: Send>(&self, py: Python<'_>, field: fn(&LlamaTokenData) -> T) -> PyResult<Vec<T>> {
        self.with_array(py, |array| Ok(array.data.iter().map(field).collect()))
    }
}

#[pymethods]
impl PyLlamaTokenDataArray {
    /// Token ids, a new int32 array.
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        Ok(PyArray1::from_vec(py, self.column(py, |data| data.id().0)?))
    }

    /// Logits, a new float32 array.
    #[getter]
    fn logits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        Ok(f32_vector(py, self.column(py, LlamaTokenData::logit)?))
    }

    /// Probabilities, a new float32 array (zeros until a sampler computes them).
    #[getter]
    fn p<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        Ok(f32_vector(py, self.column(py, LlamaTokenData::p)?))
    }

    /// Index of the candidate the last sampler selected, or None.
    #[getter]
    fn selected(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.with_array(py, |array| Ok(array.selected))
    }

    /// Whether the candidates are sorted by logit, highest first.
    #[getter]
    fn sorted(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_array(py, |array| Ok(array.sorted))
    }

    /// The token the last sampler selected, or None.
    fn selected_token(&self, py: Python<'_>) -> PyResult<Option<i32>> {
        self.with_array(py, |array| Ok(array.selected_token().map(|token| token.0)))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_array(py, |array| Ok(array.data.len()))
    }

    fn __getitem__(&self, py: Python<'_>, index: isize) -> PyResult<PyLlamaTokenData> {
        self.with_array(py, |array| {
            let len = isize::try_from(array.data.len()).unwrap_or(isize::MAX);
            let at = if index < 0 { index + len } else { index };
            let data = usize::try_from(at)
                .ok()
                .and_then(|at| array.data.get(at))
                .ok_or_else(|| Error::index(format!("candidate {index} is out of range")))?;
            Ok(PyLlamaTokenData {
                id: data.id().0,
                logit: data.logit(),
                p: data.p(),
            })
        })
    }

    fn __repr__(&self) -> String {
        match self.array.try_lock() {
            Ok(array) => format!("<LlamaTokenDataArray {} candidates>", array.data.len()),
            Err(_) => "<LlamaTokenDataArray (busy)>".to_owned(),
        }
    }
}
