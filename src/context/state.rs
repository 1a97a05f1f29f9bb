//! `LlamaContext`'s methods that save and restore its state (`open_context/state.rs`).

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::{OpenContext, PyLlamaContext};
use crate::errors::python::to_py;
use crate::errors::{Error, ExcClass};
use crate::open_context::state::{check_capacity, check_flags, Refusal};
use crate::paths::{existing_file, extract_path};
use crate::tokens::python::extract_token_ids;
use crate::tokens::{check_vocab, to_llama_tokens};

/// The bytes of any bytes-like object (`bytes`, `bytearray`, `memoryview`, numpy uint8 ...).
fn extract_bytes(src: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = src.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    // The buffer protocol is not in the limited API of Python 3.10; `memoryview` is, and
    // accepts exactly the bytes-like objects (unlike `bytes(5)`, which makes 5 zero bytes).
    let view = src
        .py()
        .import("builtins")?
        .getattr("memoryview")?
        .call1((src,))
        .map_err(|_| {
            to_py(Error::Type(format!(
                "expected a bytes-like object, got {}",
                src.get_type()
            )))
        })?;
    Ok(view
        .call_method0("tobytes")?
        .cast_into::<PyBytes>()?
        .as_bytes()
        .to_vec())
}

/// A state file path for writing, whose parent directory must exist.
fn writable_path(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let path = extract_path(path)?;
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(to_py(Error::FileNotFound(format!(
            "no such directory: {}",
            parent.display()
        ))));
    }
    Ok(path)
}

#[pymethods]
impl PyLlamaContext {
    /// Writes the whole state (KV memory) and `tokens` to a session file. `SaveSessionError`
    /// when llama.cpp cannot write it.
    fn save_session_file(&self, py: Python<'_>, path: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let path = writable_path(path)?;
        let ids = extract_token_ids(tokens)?;
        self.run(py, |native| {
            check_vocab(&ids, native.n_vocab)?;
            Ok(native.with(|context| context.save_session_file(&path, &to_llama_tokens(&ids)))?)
        })
    }

    /// Restores a session file; returns its tokens (at most `max_tokens`). No row has logits
    /// afterwards. `LoadSessionError` for a file that is not a session file or holds more than
    /// `max_tokens` tokens; `StateError` for a state this context refuses.
    fn load_session_file(&self, py: Python<'_>, path: &Bound<'_, PyAny>, max_tokens: usize) -> PyResult<Vec<i32>> {
        let path = existing_file(path)?;
        let max_tokens = check_capacity(max_tokens).map_err(to_py)?;
        self.run(py, |native| {
            native.load_state_file(&path, max_tokens, |refusal| match refusal {
                Refusal::Invalid(why) => Error::llama(
                    ExcClass::LoadSessionError,
                    "FailedToLoad",
                    None,
                    format!("not a session file: {why}"),
                ),
                Refusal::TooManyTokens(count) => Error::llama(
                    ExcClass::LoadSessionError,
                    "InsufficientMaxLength",
                    i64::try_from(count).ok(),
                    format!("the file holds {count} tokens, more than {max_tokens}"),
                ),
            })
        })
    }

    /// Size in bytes of the whole state (`state_get_size` under its older name).
    fn get_state_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |context| context.get_state_size())
    }

    /// Size in bytes of the whole state.
    fn state_get_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |native| Ok(native.with_mut(|context| context.state_get_size())))
    }

    /// The whole state as `bytes` (the safe form of the crate's `copy_state_data`).
    fn copy_state_data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.state_get_data(py)
    }

    /// The whole state as `bytes`. `StateError` if llama.cpp writes nothing.
    fn state_get_data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let state = self.run(py, OpenContext::state_bytes)?;
        Ok(PyBytes::new(py, &state))
    }

    /// Restores a state from a bytes-like object (the safe form of the crate's
    /// `set_state_data`); returns the bytes read. `StateError` when llama.cpp rejects it.
    fn set_state_data(&self, py: Python<'_>, src: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.state_set_data(py, src)
    }

    /// Restores a state from a bytes-like object; returns the bytes read. No row has logits
    /// afterwards. `StateError` when llama.cpp rejects the data.
    fn state_set_data(&self, py: Python<'_>, src: &Bound<'_, PyAny>) -> PyResult<usize> {
        let src = extract_bytes(src)?;
        self.run(py, |native| native.set_state_bytes(&src, false))
    }

    /// Writes the whole state and `tokens` to `path`; returns True. `StateError` on failure.
    fn state_save_file(&self, py: Python<'_>, path: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
        let path = writable_path(path)?;
        let ids = extract_token_ids(tokens)?;
        self.run(py, |native| {
            check_vocab(&ids, native.n_vocab)?;
            let saved = native.with_mut(|context| context.state_save_file(&path, &to_llama_tokens(&ids)));
            if saved {
                Ok(true)
            } else {
                Err(Error::state(
                    "SaveFile",
                    format!("llama.cpp could not write {}", path.display()),
                ))
            }
        })
    }

    /// Restores the whole state from `path`; returns the tokens saved with it (at most
    /// `n_token_capacity`). No row has logits afterwards. `StateError` on failure.
    fn state_load_file(&self, py: Python<'_>, path: &Bound<'_, PyAny>, n_token_capacity: usize) -> PyResult<Vec<i32>> {
        let path = existing_file(path)?;
        let capacity = check_capacity(n_token_capacity).map_err(to_py)?;
        self.run(py, |native| {
            native.load_state_file(&path, capacity, |refusal| match refusal {
                Refusal::Invalid(why) => Error::state("LoadFile", format!("not a state file: {why}")),
                Refusal::TooManyTokens(count) => Error::state(
                    "LoadFile",
                    format!("the file holds {count} tokens, more than {capacity}"),
                ),
            })
        })
    }

    /// Size in bytes of sequence `seq_id`'s state.
    fn state_seq_get_size(&self, py: Python<'_>, seq_id: i64) -> PyResult<usize> {
        self.state_seq_get_size_ext(py, seq_id, 0)
    }

    /// Size in bytes of sequence `seq_id`'s state with `flags` (0 or
    /// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`).
    fn state_seq_get_size_ext(&self, py: Python<'_>, seq_id: i64, flags: u32) -> PyResult<usize> {
        let flags = check_flags(flags).map_err(to_py)?;
        self.run(py, |native| {
            let seq_id = native.seq(seq_id)?;
            Ok(native.with_mut(|context| context.state_seq_get_size_ext(seq_id, flags)))
        })
    }

    /// Sequence `seq_id`'s state as `bytes`. `StateError` if llama.cpp writes nothing
    /// (e.g. an empty sequence).
    fn state_seq_get_data<'py>(&self, py: Python<'py>, seq_id: i64) -> PyResult<Bound<'py, PyBytes>> {
        self.state_seq_get_data_ext(py, seq_id, 0)
    }

    /// Sequence `seq_id`'s state with `flags`, as `bytes`.
    fn state_seq_get_data_ext<'py>(&self, py: Python<'py>, seq_id: i64, flags: u32) -> PyResult<Bound<'py, PyBytes>> {
        let flags = check_flags(flags).map_err(to_py)?;
        let state = self.run(py, |native| {
            let seq_id = native.seq(seq_id)?;
            native.seq_state_bytes(seq_id, flags)
        })?;
        Ok(PyBytes::new(py, &state))
    }

    /// Restores a sequence state into `dest_seq_id`; returns the bytes read. No row has
    /// logits afterwards. `StateError` when llama.cpp rejects the data.
    fn state_seq_set_data(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dest_seq_id: i64) -> PyResult<usize> {
        self.state_seq_set_data_ext(py, src, dest_seq_id, 0)
    }

    /// `state_seq_set_data` with `flags`.
    fn state_seq_set_data_ext(
        &self,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        dest_seq_id: i64,
        flags: u32,
    ) -> PyResult<usize> {
        let flags = check_flags(flags).map_err(to_py)?;
        let src = extract_bytes(src)?;
        self.run(py, |native| {
            let dest_seq_id = native.seq(dest_seq_id)?;
            native.set_seq_state_bytes(&src, dest_seq_id, flags)
        })
    }

    /// Writes sequence `seq_id`'s state and `tokens` to `path`; returns the bytes written.
    /// `StateError` on failure.
    fn state_seq_save_file(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        seq_id: i64,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let path = writable_path(path)?;
        let ids = extract_token_ids(tokens)?;
        self.run(py, |native| {
            check_vocab(&ids, native.n_vocab)?;
            let seq_id = native.seq(seq_id)?;
            let written = native.with_mut(|context| context.state_seq_save_file(&path, seq_id, &to_llama_tokens(&ids)));
            if written == 0 {
                return Err(Error::state(
                    "SeqSaveFile",
                    format!("llama.cpp could not write {}", path.display()),
                ));
            }
            Ok(written)
        })
    }

    /// Restores a sequence state file into `dest_seq_id`; returns its tokens (at most
    /// `n_token_capacity`). No row has logits afterwards. `StateError` on failure.
    fn state_seq_load_file(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        dest_seq_id: i64,
        n_token_capacity: usize,
    ) -> PyResult<Vec<i32>> {
        let path = existing_file(path)?;
        let capacity = check_capacity(n_token_capacity).map_err(to_py)?;
        self.run(py, |native| {
            let dest_seq_id = native.seq(dest_seq_id)?;
            let file = std::fs::read(&path).map_err(|err| Error::state("SeqLoadFile", err.to_string()))?;
            native.restore_seq_state_file(&file, dest_seq_id, capacity)
        })
    }
}
