//! Turning Python path arguments into paths llama.cpp can take.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::errors::python::to_py;
use crate::errors::{Error, Result};

/// A path llama.cpp can open: valid UTF-8 with no NUL byte (the crate would panic or fail on
/// either). Accepts `str` and `os.PathLike`.
pub fn extract_path(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let path: PathBuf = path.extract()?;
    checked(path).map_err(to_py)
}

fn checked(path: PathBuf) -> Result<PathBuf> {
    let Some(text) = path.to_str() else {
        return Err(Error::value(format!("path is not valid UTF-8: {}", path.display())));
    };
    if text.contains('\0') {
        return Err(Error::value("path contains a NUL byte"));
    }
    Ok(path)
}

/// Like `extract_path`, for a file that must already exist.
pub fn existing_file(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let path = extract_path(path)?;
    if !path.is_file() {
        return Err(to_py(Error::FileNotFound(format!("no such file: {}", path.display()))));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn refuses_nul_and_non_utf8() {
        assert!(matches!(checked(PathBuf::from("a\0b")), Err(Error::Value(_))));
        let latin1 = PathBuf::from(std::ffi::OsString::from_vec(vec![b'a', 0xff]));
        assert!(matches!(checked(latin1), Err(Error::Value(_))));
        assert!(checked(PathBuf::from("model.gguf")).is_ok());
    }
}
