//! The Python side of the engine core's `Error`: the exception classes, built with `type()` at
//! import time (two of them need a second base, e.g. `KvCacheConversionError` is also an
//! `OverflowError`, which `create_exception!` cannot do), and the one place where an `Error`
//! becomes one. An instance carries the variant name in `.kind` and, where llama.cpp returned
//! one, the integer code in `.code`.
//!
//! These are functions, not `From` conversions: Rust's orphan rule allows those only in the
//! crate of `Error` or of `PyErr`, and the core crate builds without PyO3, so that a Rust
//! program of the core (its example) and this extension share one build of it. A `PyResult`
//! function calls the core with `.map_err(to_py)?`.

use pyo3::exceptions::{
    PyConnectionError, PyException, PyFileNotFoundError, PyIndexError, PyOverflowError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use super::{index_of, BuiltinBase, Error, ExcClass, CLASSES};

static TYPES: [PyOnceLock<Py<PyType>>; CLASSES.len()] = [const { PyOnceLock::new() }; CLASSES.len()];

/// The Python class of `class`. Panics only if called before `register` ran, which cannot
/// happen: the module registers its exceptions before any other name.
pub fn class_object(py: Python<'_>, class: ExcClass) -> &Bound<'_, PyType> {
    PyOnceLock::get(&TYPES[index_of(class)], py)
        .expect("llamactx exceptions are registered at import")
        .bind(py)
}

/// Creates every exception class and adds it to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let builtins_type = py.get_type::<PyType>();
    for spec in CLASSES {
        let first_base = if spec.class == ExcClass::LlamaCppError {
            py.get_type::<PyException>()
        } else {
            class_object(py, spec.base).clone()
        };
        let bases = match spec.extra_base {
            Some(extra) => PyTuple::new(py, [first_base, builtin(py, extra)])?,
            None => PyTuple::new(py, [first_base])?,
        };
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "llamactx")?;
        namespace.set_item("__doc__", spec.doc)?;
        if spec.class == ExcClass::LlamaCppError {
            namespace.set_item("kind", py.None())?;
            namespace.set_item("code", py.None())?;
        }
        let class = builtins_type
            .call1((spec.name, bases, namespace))?
            .cast_into::<PyType>()?;
        m.add(spec.name, &class)?;
        let _ = TYPES[index_of(spec.class)].set(py, class.unbind());
    }
    Ok(())
}

fn builtin(py: Python<'_>, base: BuiltinBase) -> Bound<'_, PyType> {
    match base {
        BuiltinBase::Overflow => py.get_type::<PyOverflowError>(),
        BuiltinBase::Value => py.get_type::<PyValueError>(),
        BuiltinBase::Connection => py.get_type::<PyConnectionError>(),
    }
}

/// A Python exception on its way through the core (a callback's, raised again when the core's
/// call returns).
pub fn foreign(err: PyErr) -> Error {
    Error::Foreign(Box::new(err))
}

/// The Python exception of `err`: its class's instance, or the exception a Python callback
/// raised (`foreign`), or what Ctrl-C raises.
pub fn to_py(err: Error) -> PyErr {
    match err {
        Error::Llama {
            class,
            kind,
            code,
            message,
        } => Python::attach(|py| instance(py, class, &kind, code, &message)),
        // Python's own handler saw the SIGINT too: running it raises `KeyboardInterrupt`
        // (or whatever the program's handler does; if it raises nothing, the decode was
        // still aborted).
        Error::Aborted { interrupted: true } => Python::attach(|py| match py.check_signals() {
            Err(raised) => raised,
            Ok(()) => instance(
                py,
                ExcClass::DecodeAborted,
                "Interrupted",
                Some(2),
                "decode interrupted by SIGINT",
            ),
        }),
        Error::Aborted { interrupted: false } => Python::attach(|py| {
            instance(
                py,
                ExcClass::DecodeAborted,
                "Aborted",
                Some(2),
                "decode aborted by the abort callback",
            )
        }),
        Error::Value(message) => PyValueError::new_err(message),
        Error::Index(message) => PyIndexError::new_err(message),
        Error::Type(message) => PyTypeError::new_err(message),
        Error::FileNotFound(message) => PyFileNotFoundError::new_err(message),
        Error::Runtime(message) => PyRuntimeError::new_err(message),
        Error::Poisoned(what) => {
            PyRuntimeError::new_err(format!("{what} is unusable: a thread panicked while holding it"))
        }
        Error::Foreign(err) => match err.downcast::<PyErr>() {
            Ok(raised) => *raised,
            Err(other) => PyRuntimeError::new_err(other.to_string()),
        },
        Error::Panic(message) => PyRuntimeError::new_err(format!(
            "internal error in llamactx (a bug, please report it): {message}"
        )),
    }
}

fn instance(py: Python<'_>, class: ExcClass, kind: &str, code: Option<i64>, message: &str) -> PyErr {
    let built = class_object(py, class).call1((message,)).and_then(|exc| {
        exc.setattr("kind", kind)?;
        exc.setattr("code", code)?;
        Ok(exc)
    });
    match built {
        Ok(exc) => PyErr::from_value(exc),
        Err(err) => err,
    }
}
