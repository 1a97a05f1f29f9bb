//! Token arguments from Python: any sequence of ints or a 1-D integer numpy array.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::check_vocab;
use crate::errors::python::to_py;
use crate::errors::Error;

/// Extracts token ids as `i32` without checking them against a vocabulary.
pub fn extract_token_ids(tokens: &Bound<'_, PyAny>) -> PyResult<Vec<i32>> {
    if tokens.is_instance_of::<PyString>() || tokens.is_instance_of::<PyBytes>() {
        return Err(to_py(Error::Type(
            "tokens must be a sequence of ints, not a string".to_owned(),
        )));
    }
    if let Ok(array) = tokens.cast::<PyUntypedArray>() {
        if array.ndim() != 1 {
            return Err(to_py(Error::value(format!(
                "tokens must be a 1-D array, got {} dimensions",
                array.ndim()
            ))));
        }
        if !matches!(array.dtype().kind(), b'i' | b'u') {
            return Err(to_py(Error::Type(format!(
                "tokens must be an integer array, got dtype {}",
                array.dtype()
            ))));
        }
        let as_list = array.call_method0("tolist")?;
        return extract_token_ids(&as_list);
    }
    let mut ids = Vec::with_capacity(tokens.len().unwrap_or(0));
    for item in tokens.try_iter()? {
        let id: i64 = item?.extract()?;
        ids.push(i32::try_from(id).map_err(|_| to_py(Error::value(format!("token id {id} is out of range"))))?);
    }
    Ok(ids)
}

/// `tokens` (any sequence of ints, or a 1-D integer array) as ids of `model`'s vocabulary: the
/// one check every path makes, for Python's (`embed`'s ids). `ValueError` for one outside it.
#[pyfunction]
#[pyo3(name = "_vocabulary_ids")]
pub fn vocabulary_ids(
    model: &Bound<'_, crate::model::python::PyLlamaModel>,
    tokens: &Bound<'_, PyAny>,
) -> PyResult<Vec<i32>> {
    let ids = extract_token_ids(tokens)?;
    check_vocab(&ids, model.get().vocabulary().map_err(to_py)?.n_vocab()).map_err(to_py)?;
    Ok(ids)
}
