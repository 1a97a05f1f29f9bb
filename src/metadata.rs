//! Model metadata without the crate's fixed buffers.
//!
//! The crate's `meta_val_str`/`meta_key_by_index` slice their buffer by the length llama.cpp
//! reports, so a value longer than the buffer panics. llama.cpp's values are the GGUF file's
//! scalars and strings (arrays are skipped), so the longest string in the file's header bounds
//! them all: we read that bound from the header once and size every buffer by it.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Mutex;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::{ChatTemplateError, StringFromModelError};

use crate::errors::{Error, Result};

/// Longest text llama.cpp gives a scalar (a float printed with `%f`).
const SCALAR_TEXT_LEN: usize = 64;

const GGUF_TYPE_STRING: u32 = 8;
const GGUF_TYPE_ARRAY: u32 = 9;

fn fixed_size(gguf_type: u32) -> Option<u64> {
    match gguf_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

struct Header<R> {
    reader: R,
    longest: u64,
}

impl<R: Read> Header<R> {
    fn u32(&mut self) -> std::io::Result<u32> {
        let mut bytes = [0; 4];
        self.reader.read_exact(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        let mut bytes = [0; 8];
        self.reader.read_exact(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn skip(&mut self, n: u64) -> std::io::Result<()> {
        let skipped = std::io::copy(&mut (&mut self.reader).take(n), &mut std::io::sink())?;
        if skipped == n {
            Ok(())
        } else {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
    }

    fn string(&mut self, counted: bool) -> std::io::Result<()> {
        let len = self.u64()?;
        if counted {
            self.longest = self.longest.max(len);
        }
        self.skip(len)
    }

    fn value(&mut self, gguf_type: u32) -> std::io::Result<()> {
        match (gguf_type, fixed_size(gguf_type)) {
            (_, Some(size)) => self.skip(size),
            (GGUF_TYPE_STRING, None) => self.string(true),
            (GGUF_TYPE_ARRAY, None) => {
                let item_type = self.u32()?;
                let count = self.u64()?;
                match fixed_size(item_type) {
                    Some(size) => self.skip(size.saturating_mul(count)),
                    // Array items never reach llama.cpp's metadata strings.
                    None if item_type == GGUF_TYPE_STRING => (0..count).try_for_each(|_| self.string(false)),
                    None => Err(std::io::ErrorKind::InvalidData.into()),
                }
            }
            _ => Err(std::io::ErrorKind::InvalidData.into()),
        }
    }

    /// The longest key or string value of the header.
    fn longest_text(mut self) -> std::io::Result<u64> {
        if self.u32()? != u32::from_le_bytes(*b"GGUF") {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let _version = self.u32()?;
        let _n_tensors = self.u64()?;
        let n_kv = self.u64()?;
        for _ in 0..n_kv {
            self.string(true)?;
            let value_type = self.u32()?;
            self.value(value_type)?;
        }
        Ok(self.longest)
    }
}

static BOUNDS: Mutex<Vec<(std::path::PathBuf, usize)>> = Mutex::new(Vec::new());

/// A buffer size that holds every key and value llama.cpp reports for the model at `path`.
fn buffer_size(path: &Path) -> Result<usize> {
    let mut bounds = BOUNDS.lock().map_err(|_| Error::Poisoned("metadata cache"))?;
    if let Some((_, size)) = bounds.iter().find(|(known, _)| known == path) {
        return Ok(*size);
    }
    let file = File::open(path).map_err(|err| Error::value(format!("cannot read {}: {err}", path.display())))?;
    let longest = Header {
        reader: BufReader::new(file),
        longest: 0,
    }
    .longest_text()
    .map_err(|err| Error::value(format!("cannot read the GGUF header of {}: {err}", path.display())))?;
    let size = usize::try_from(longest)
        .unwrap_or(usize::MAX)
        .max(SCALAR_TEXT_LEN)
        .saturating_add(1);
    bounds.push((path.to_owned(), size));
    Ok(size)
}

/// The value of `key`.
pub fn value(model: &LlamaModel, path: &Path, key: &str) -> Result<String> {
    if key.contains('\0') {
        return Err(Error::value("metadata key contains a NUL byte"));
    }
    Ok(model.meta_val_str(key, buffer_size(path)?)?)
}

/// Every `(key, value)` pair, in llama.cpp's order.
pub fn all(model: &LlamaModel, path: &Path) -> Result<Vec<(String, String)>> {
    let size = buffer_size(path)?;
    (0..model.meta_count())
        .map(|i| Ok((model.meta_key_by_index(i, size)?, model.meta_val_str_by_index(i, size)?)))
        .collect()
}

/// The default chat template (read through a pointer, so no buffer can be too small).
pub fn chat_template(model: &LlamaModel) -> Result<String> {
    match model.chat_template(None) {
        Ok(template) => Ok(template.to_owned()),
        Err(StringFromModelError::ReturnedError(code)) => Err(ChatTemplateError::MissingTemplate(code).into()),
        Err(StringFromModelError::Utf8Error(err)) => Err(ChatTemplateError::Utf8Error(err).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn longest_text_skips_arrays() {
        let mut file = b"GGUF".to_vec();
        file.extend(3u32.to_le_bytes());
        file.extend(0u64.to_le_bytes());
        file.extend(3u64.to_le_bytes());
        file.extend(text("general.name"));
        file.extend(GGUF_TYPE_STRING.to_le_bytes());
        file.extend(text("tiny"));
        file.extend(text("k"));
        file.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        file.extend(GGUF_TYPE_STRING.to_le_bytes());
        file.extend(1u64.to_le_bytes());
        file.extend(text(&"x".repeat(500)));
        file.extend(text("n"));
        file.extend(4u32.to_le_bytes());
        file.extend(7u32.to_le_bytes());
        let longest = Header {
            reader: file.as_slice(),
            longest: 0,
        }
        .longest_text()
        .unwrap();
        assert_eq!(longest, "general.name".len() as u64);
    }

    #[test]
    fn truncated_header_is_an_error() {
        let header = Header {
            reader: &b"GGUF\x03\x00"[..],
            longest: 0,
        };
        assert!(header.longest_text().is_err());
    }
}
