//! Reading what the last decode produced: logits, as new numpy arrays.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::{Native, PyLlamaContext};
use crate::arrays::f32_vector;
use crate::errors::{Error, Result};

impl Native {
    /// The batch index of output row `i` (negative counts from the last output), or
    /// `IndexError` when that row has no logits.
    pub fn logit_row(&self, i: i32) -> Result<i32> {
        if self.logit_rows.is_empty() {
            return Err(Error::index(
                "no output row has logits: decode a batch with logits=True first (a state restore leaves none)",
            ));
        }
        let found = if i < 0 {
            i64::try_from(self.logit_rows.len())
                .ok()
                .and_then(|n| usize::try_from(n + i64::from(i)).ok())
                .map(|k| self.logit_rows[k])
        } else {
            self.logit_rows.contains(&i).then_some(i)
        };
        found.ok_or_else(|| {
            Error::index(format!(
                "row {i} has no logits; rows with logits: {:?}",
                self.logit_rows
            ))
        })
    }

    fn logits_of_row(&self, i: i32) -> Result<Vec<f32>> {
        let row = self.logit_row(i)?;
        Ok(self.with(|context| context.get_logits_ith(row).to_vec()))
    }
}

#[pymethods]
impl PyLlamaContext {
    /// Logits of the first output row, a new float32 array of shape `(n_vocab,)`.
    /// `IndexError` when no row has logits.
    fn get_logits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let logits = self.run(py, |native| {
            let first = native.logit_rows.first().copied().unwrap_or(0);
            native.logits_of_row(first)
        })?;
        Ok(f32_vector(py, logits))
    }

    /// Logits of batch row `i` (negative `i` counts from the last output), a new float32
    /// array of shape `(n_vocab,)`. `IndexError` if row `i` has no logits.
    fn get_logits_ith<'py>(&self, py: Python<'py>, i: i32) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let logits = self.run(py, |native| native.logits_of_row(i))?;
        Ok(f32_vector(py, logits))
    }
}
