//! Owned numpy arrays from native slices (always copies: llama.cpp reuses its buffers).

use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A new C-contiguous float32 array that takes `values` without a second copy.
pub fn f32_vector(py: Python<'_>, values: Vec<f32>) -> Bound<'_, PyArray1<f32>> {
    let array = PyArray1::from_vec(py, values);
    debug_assert!(array.is_c_contiguous());
    array
}

/// A new C-contiguous `(rows, values.len() / rows)` float32 array.
pub fn f32_matrix(py: Python<'_>, values: Vec<f32>, rows: usize) -> PyResult<Bound<'_, numpy::PyArray2<f32>>> {
    let cols = values.len().checked_div(rows).unwrap_or(0);
    f32_vector(py, values).reshape([rows, cols])
}
