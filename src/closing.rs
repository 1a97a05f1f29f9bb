//! `with` blocks for the classes that hold native resources.

/// `__enter__` and `__exit__` for a pyclass whose `close(py)` releases what it holds: `with
/// Class(...) as value:` closes it when the block ends, however it ends (an exception goes on).
macro_rules! closed_by_with {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            fn __enter__(slf: pyo3::Py<Self>) -> pyo3::Py<Self> {
                slf
            }

            fn __exit__(
                &self,
                py: pyo3::Python<'_>,
                _exc_type: &pyo3::Bound<'_, pyo3::PyAny>,
                _exc: &pyo3::Bound<'_, pyo3::PyAny>,
                _tb: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<()> {
                self.close(py)
            }
        }
    };
}

pub(crate) use closed_by_with;
