//! Model metadata without the crate's fixed buffers.
//!
//! The crate's `meta_val_str`/`meta_key_by_index` slice their buffer by the length llama.cpp
//! reports, so a value longer than the buffer panics. llama.cpp's values are the GGUF file's
//! scalars and strings (arrays are skipped), so the longest string in the file's header bounds
//! them all: we read that bound from the header once and size every buffer by it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Mutex;

use llama_cpp_4::model::LlamaModel;
use llama_cpp_4::{ChatTemplateError, StringFromModelError};

use crate::errors::{Error, ExcClass, Result};

/// Longest text llama.cpp gives a scalar (a float printed with `%f`) [llama.cpp internal].
const SCALAR_TEXT_LEN: usize = 64;

/// GGUF value types and the vocabulary key, for walking a file's header [llama.cpp internal].
pub const GGUF_TYPE_STRING: u32 = 8;
const GGUF_TYPE_ARRAY: u32 = 9;
const TOKEN_LIST_KEY: &[u8] = b"tokenizer.ggml.tokens";
const TOKEN_TYPE_KEY: &[u8] = b"tokenizer.ggml.token_type";
const TOKENIZER_KEY: &[u8] = b"tokenizer.ggml.model";
pub const GGUF_TYPE_INT32: u32 = 5;
/// `LLAMA_TOKEN_TYPE_BYTE`, in `tokenizer.ggml.token_type`.
const BYTE_TOKEN_TYPE: i32 = 6;
/// The tokenizer whose vocabulary type (WordPiece) has no byte tokens: llama.cpp aborts
/// (`GGML_ABORT` in `token_to_byte`) while it renders one at load.
const WORDPIECE_TOKENIZER: &[u8] = b"bert";

fn fixed_size(gguf_type: u32) -> Option<u64> {
    match gguf_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// A value of a key the walk keeps (`Header::keeping`): a scalar's bits (as the file has them),
/// a string, or what an array holds.
#[derive(Clone, Debug, PartialEq)]
pub enum KeptValue {
    Scalar { gguf_type: u32, bits: u64 },
    Text(String),
    Array { item_type: u32, count: u64 },
}

impl KeptValue {
    /// The GGUF type of the value (an array's is `GGUF_TYPE_ARRAY`).
    pub fn gguf_type(&self) -> u32 {
        match self {
            Self::Scalar { gguf_type, .. } => *gguf_type,
            Self::Text(_) => GGUF_TYPE_STRING,
            Self::Array { .. } => GGUF_TYPE_ARRAY,
        }
    }
}

/// GGUF's scalar types as llama.cpp's getters ask for them [llama.cpp internal].
pub const GGUF_TYPE_UINT32: u32 = 4;
pub const GGUF_TYPE_FLOAT32: u32 = 6;
pub const GGUF_TYPE_BOOL: u32 = 7;
/// The longest string value the walk keeps (longer ones are kept as their type alone).
const KEPT_TEXT_LEN: u64 = 4096;
/// ggml's bound on a tensor's name, its terminating NUL included (`GGML_MAX_NAME`), and on its
/// dimensions (`GGML_MAX_DIMS`) [llama.cpp internal].
const MAX_TENSOR_NAME: u64 = 64;
const MAX_DIMS: u32 = 4;
/// The most tensors a walk that keeps their shapes reads: far above any projector's (about 30
/// per block), and a bound on what a crafted count can make it hold.
const MAX_KEPT_TENSORS: u64 = 1 << 16;

struct Header<R> {
    reader: R,
    /// The prefixes of the keys whose values are kept, in `kept` (none: no value is).
    keeping: &'static [&'static str],
    kept: HashMap<String, KeptValue>,
    /// Each tensor's dimensions (ggml's `ne`, innermost first), when the walk keeps them.
    shapes: Option<HashMap<String, Vec<u64>>>,
    longest: u64,
    /// A token that `tokenizer.ggml.tokens` lists twice: llama.cpp asserts (aborts) on those.
    duplicate_token: Option<String>,
    /// The ggml types of the file's tensors (read by `scan_tensors`).
    tensor_types: BTreeSet<u32>,
    /// `tokenizer.ggml.model`.
    tokenizer: Vec<u8>,
    /// Whether `tokenizer.ggml.token_type` marks a token as a byte.
    has_byte_token: bool,
    /// Whether a tensor is named `POSITION_TABLE` (read by `scan_tensors`).
    learned_positions: bool,
}

/// The tensor of learned (absolute) position embeddings (GPT-2, StarCoder, BERT, MPT): llama.cpp
/// checks that it has `n_ctx_train` rows, and reads row `pos` for each token (`get_rows`, which
/// asserts on a position past them).
const POSITION_TABLE: &[u8] = b"position_embd.weight";

impl<R: Read> Header<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            keeping: &[],
            kept: HashMap::new(),
            shapes: None,
            longest: 0,
            duplicate_token: None,
            tensor_types: BTreeSet::new(),
            tokenizer: Vec::new(),
            has_byte_token: false,
            learned_positions: false,
        }
    }

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

    fn string_len(&mut self, counted: bool) -> std::io::Result<u64> {
        let len = self.u64()?;
        if counted {
            self.longest = self.longest.max(len);
        }
        Ok(len)
    }

    fn read_string(&mut self) -> std::io::Result<Vec<u8>> {
        let len = self.string_len(true)?;
        let mut text = Vec::new();
        (&mut self.reader).take(len).read_to_end(&mut text)?;
        if text.len() as u64 == len {
            Ok(text)
        } else {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
    }

    fn value(&mut self, gguf_type: u32, key: &[u8]) -> std::io::Result<()> {
        if let Some(key) = std::str::from_utf8(key)
            .ok()
            .filter(|key| self.keeping.iter().any(|prefix| key.starts_with(prefix)))
        {
            let kept = self.kept_value(gguf_type, key)?;
            self.kept.insert(key.to_owned(), kept);
            return Ok(());
        }
        match (gguf_type, fixed_size(gguf_type)) {
            (_, Some(size)) => self.skip(size),
            (GGUF_TYPE_STRING, None) if key == TOKENIZER_KEY => {
                self.tokenizer = self.read_string()?;
                Ok(())
            }
            (GGUF_TYPE_STRING, None) => {
                let len = self.string_len(true)?;
                self.skip(len)
            }
            (GGUF_TYPE_ARRAY, None) => {
                let item_type = self.u32()?;
                let count = self.u64()?;
                self.array_items(item_type, count, key)
            }
            _ => Err(std::io::ErrorKind::InvalidData.into()),
        }
    }

    /// Reads the value of a kept key (which never is one of the vocabulary's).
    fn kept_value(&mut self, gguf_type: u32, key: &str) -> std::io::Result<KeptValue> {
        match (gguf_type, fixed_size(gguf_type)) {
            (_, Some(size)) => {
                let mut bytes = [0; 8];
                let width = usize::try_from(size).map_err(|_| std::io::ErrorKind::InvalidData)?;
                self.reader.read_exact(&mut bytes[..width])?;
                Ok(KeptValue::Scalar {
                    gguf_type,
                    bits: u64::from_le_bytes(bytes),
                })
            }
            (GGUF_TYPE_STRING, None) => {
                let len = self.string_len(true)?;
                if len > KEPT_TEXT_LEN {
                    self.skip(len)?;
                    return Ok(KeptValue::Text(String::new()));
                }
                let mut text = Vec::new();
                (&mut self.reader).take(len).read_to_end(&mut text)?;
                if text.len() as u64 != len {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                Ok(KeptValue::Text(String::from_utf8_lossy(&text).into_owned()))
            }
            (GGUF_TYPE_ARRAY, None) => {
                let item_type = self.u32()?;
                let count = self.u64()?;
                // The walk goes on past it as past any other array.
                self.array_items(item_type, count, key.as_bytes())?;
                Ok(KeptValue::Array { item_type, count })
            }
            _ => Err(std::io::ErrorKind::InvalidData.into()),
        }
    }

    fn array_items(&mut self, item_type: u32, count: u64, key: &[u8]) -> std::io::Result<()> {
        match fixed_size(item_type) {
            Some(_) if item_type == GGUF_TYPE_INT32 && key == TOKEN_TYPE_KEY => self.token_types(count),
            Some(size) => self.skip(size.saturating_mul(count)),
            None if item_type == GGUF_TYPE_STRING && key == TOKEN_LIST_KEY => self.token_list(count),
            // Array items never reach llama.cpp's metadata strings.
            None if item_type == GGUF_TYPE_STRING => (0..count).try_for_each(|_| {
                let len = self.string_len(false)?;
                self.skip(len)
            }),
            None => Err(std::io::ErrorKind::InvalidData.into()),
        }
    }

    fn token_list(&mut self, count: u64) -> std::io::Result<()> {
        let mut seen = HashSet::new();
        for _ in 0..count {
            let len = self.string_len(false)?;
            let mut token = Vec::new();
            (&mut self.reader).take(len).read_to_end(&mut token)?;
            if token.len() as u64 != len {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if self.duplicate_token.is_none() && !seen.insert(token.clone()) {
                self.duplicate_token = Some(String::from_utf8_lossy(&token).into_owned());
            }
        }
        Ok(())
    }

    fn token_types(&mut self, count: u64) -> std::io::Result<()> {
        for _ in 0..count {
            self.has_byte_token |= self.u32()?.cast_signed() == BYTE_TOKEN_TYPE;
        }
        Ok(())
    }

    /// Reads the key-value section of the header; returns the number of tensors.
    fn scan(&mut self) -> std::io::Result<u64> {
        if self.u32()? != u32::from_le_bytes(*b"GGUF") {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let _version = self.u32()?;
        let n_tensors = self.u64()?;
        let n_kv = self.u64()?;
        for _ in 0..n_kv {
            let key = self.read_string()?;
            let value_type = self.u32()?;
            self.value(value_type, &key)?;
        }
        Ok(n_tensors)
    }

    /// Reads the tensor infos that follow the key-value section (name, dimensions, type,
    /// offset), keeping their types, whether one is the position table, and their shapes when
    /// `shapes` is set.
    fn scan_tensors(&mut self, n_tensors: u64) -> std::io::Result<()> {
        for _ in 0..n_tensors {
            let name_len = self.string_len(false)?;
            // A name is read only where it is kept or may be the table's: a length is the
            // file's to claim.
            let name = if self.shapes.is_some() {
                if name_len >= MAX_TENSOR_NAME {
                    return Err(std::io::ErrorKind::InvalidData.into());
                }
                let mut name = vec![0; usize::try_from(name_len).map_err(|_| std::io::ErrorKind::InvalidData)?];
                self.reader.read_exact(&mut name)?;
                Some(name)
            } else if name_len == POSITION_TABLE.len() as u64 {
                let mut name = vec![0; POSITION_TABLE.len()];
                self.reader.read_exact(&mut name)?;
                Some(name)
            } else {
                self.skip(name_len)?;
                None
            };
            self.learned_positions |= name.as_deref() == Some(POSITION_TABLE);
            let n_dims = self.u32()?;
            if let (Some(shapes), Some(name)) = (self.shapes.as_mut(), name) {
                if n_dims > MAX_DIMS {
                    return Err(std::io::ErrorKind::InvalidData.into());
                }
                let mut dims = Vec::new();
                for _ in 0..n_dims {
                    let mut bytes = [0; 8];
                    self.reader.read_exact(&mut bytes)?;
                    dims.push(u64::from_le_bytes(bytes));
                }
                shapes.insert(String::from_utf8_lossy(&name).into_owned(), dims);
            } else {
                self.skip(u64::from(n_dims).saturating_mul(8))?;
            }
            let tensor_type = self.u32()?;
            self.tensor_types.insert(tensor_type);
            let _offset = self.u64()?;
        }
        Ok(())
    }
}

static BOUNDS: Mutex<Vec<(std::path::PathBuf, usize)>> = Mutex::new(Vec::new());

/// The header of the file at `path`, read up to its tensor infos, and how many tensors it says
/// follow.
fn scan_file(path: &Path) -> std::io::Result<(Header<BufReader<File>>, u64)> {
    let mut header = Header::new(BufReader::new(File::open(path)?));
    let n_tensors = header.scan()?;
    Ok((header, n_tensors))
}

/// ggml types whose CPU kernels cannot multiply (no `vec_dot` in ggml-cpu's type table): a
/// LoRA tensor of one of them makes the first decode call through a null pointer
/// [llama.cpp internal].
const NO_CPU_MATMUL: [u32; 7] = [
    llama_cpp_sys_4::GGML_TYPE_Q8_1,
    llama_cpp_sys_4::GGML_TYPE_Q8_K,
    llama_cpp_sys_4::GGML_TYPE_I8,
    llama_cpp_sys_4::GGML_TYPE_I16,
    llama_cpp_sys_4::GGML_TYPE_I32,
    llama_cpp_sys_4::GGML_TYPE_I64,
    llama_cpp_sys_4::GGML_TYPE_F64,
];

/// Refuses a LoRA adapter with tensors no CPU kernel multiplies. A file that is not readable
/// GGUF passes: llama.cpp refuses it with an error of its own.
pub fn check_adapter_file(path: &Path) -> Result<()> {
    let mut header =
        Header::new(BufReader::new(File::open(path).map_err(|err| {
            Error::value(format!("cannot open {}: {err}", path.display()))
        })?));
    let Ok(n_tensors) = header.scan() else { return Ok(()) };
    if header.scan_tensors(n_tensors).is_err() {
        return Ok(());
    }
    if let Some(bad) = header.tensor_types.iter().find(|t| NO_CPU_MATMUL.contains(t)) {
        return Err(Error::llama(
            ExcClass::LlamaLoraAdapterInitError,
            "UnsupportedTensorType",
            Some(i64::from(*bad)),
            format!("the adapter has tensors of ggml type {bad}, which no CPU kernel can multiply"),
        ));
    }
    Ok(())
}

fn remember_bound(path: &Path, longest: u64) -> Result<usize> {
    let size = usize::try_from(longest)
        .unwrap_or(usize::MAX)
        .max(SCALAR_TEXT_LEN)
        .saturating_add(1);
    let mut bounds = BOUNDS.lock().map_err(|_| Error::Poisoned("metadata cache"))?;
    bounds.retain(|(known, _)| known != path);
    bounds.push((path.to_owned(), size));
    Ok(size)
}

/// What the header walk learned of a model file that llama.cpp must be kept from.
#[derive(Clone, Copy, Default)]
pub struct ModelFileFacts {
    /// The model reads learned position embeddings, one row per position up to `n_ctx_train`.
    pub learned_positions: bool,
}

/// Checks a GGUF file for what makes llama.cpp abort instead of failing (a vocabulary that
/// lists a token twice, byte tokens in a WordPiece vocabulary), notes the bound for its
/// metadata buffers, and says what later checks need (`ModelFileFacts`). A file that is not
/// readable GGUF passes: llama.cpp refuses it with an error of its own.
pub fn check_model_file(path: &Path) -> Result<ModelFileFacts> {
    let Ok((mut header, n_tensors)) = scan_file(path) else {
        return Ok(ModelFileFacts::default());
    };
    if let Some(token) = header.duplicate_token {
        return Err(Error::llama(
            ExcClass::LlamaModelLoadError,
            "InvalidVocabulary",
            None,
            format!("the vocabulary lists the token {token:?} twice; llama.cpp cannot load it"),
        ));
    }
    if header.has_byte_token && header.tokenizer == WORDPIECE_TOKENIZER {
        return Err(Error::llama(
            ExcClass::LlamaModelLoadError,
            "InvalidVocabulary",
            None,
            "the WordPiece (bert) vocabulary marks a token as a byte, which llama.cpp cannot render; it \
             cannot load it",
        ));
    }
    remember_bound(path, header.longest)?;
    // A table the walk cannot reach is one llama.cpp cannot load either.
    let learned_positions = header.scan_tensors(n_tensors).is_ok() && header.learned_positions;
    Ok(ModelFileFacts { learned_positions })
}

/// What a projector's header says: the values of its `clip.` and `general.` keys and its
/// tensors' shapes (`media/projector_file.rs` checks them).
pub struct ProjectorHeader {
    pub kept: HashMap<String, KeptValue>,
    pub shapes: HashMap<String, Vec<u64>>,
}

/// The header of the projector at `path`, or None where it is not readable GGUF (llama.cpp
/// refuses such a file with an error of its own). `Err(count)` for a file that lists more
/// tensors than any projector has.
pub fn read_projector_header(path: &Path) -> std::result::Result<Option<ProjectorHeader>, u64> {
    let Ok(file) = File::open(path) else { return Ok(None) };
    let mut header = Header::new(BufReader::new(file));
    header.keeping = &["clip.", "general."];
    header.shapes = Some(HashMap::new());
    let Ok(n_tensors) = header.scan() else { return Ok(None) };
    if n_tensors > MAX_KEPT_TENSORS {
        return Err(n_tensors);
    }
    if header.scan_tensors(n_tensors).is_err() {
        return Ok(None);
    }
    Ok(Some(ProjectorHeader {
        kept: header.kept,
        shapes: header.shapes.unwrap_or_default(),
    }))
}

/// A buffer size that holds every key and value llama.cpp reports for the model at `path`.
fn buffer_size(path: &Path) -> Result<usize> {
    let known = BOUNDS
        .lock()
        .map_err(|_| Error::Poisoned("metadata cache"))?
        .iter()
        .find(|(known, _)| known == path)
        .map(|(_, size)| *size);
    if let Some(size) = known {
        return Ok(size);
    }
    let (header, _) = scan_file(path)
        .map_err(|err| Error::value(format!("cannot read the GGUF header of {}: {err}", path.display())))?;
    remember_bound(path, header.longest)
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

/// The chat template named `name` (`tokenizer.chat_template.NAME`), or the default one (read
/// through a pointer, so no buffer can be too small).
pub fn chat_template(model: &LlamaModel, name: Option<&str>) -> Result<String> {
    match model.chat_template(name) {
        Ok(template) => Ok(template.to_owned()),
        // The crate words this as "no meta val", which names no fix.
        Err(StringFromModelError::ReturnedError(code)) => {
            let message = match name {
                Some(name) => {
                    format!(
                        "the model has no chat template named {name:?} (no tokenizer.chat_template.{name} in its GGUF)"
                    )
                }
                None => "the model has no chat template (no tokenizer.chat_template in its GGUF): give one, as Jinja \
                         source or a llama.cpp format's name such as \"chatml\" (apply_chat_template's tmpl, \
                         chat_template= of chat, ChatSession and Engine, --chat-template or --chat-template-file of \
                         the CLI and the server); chats without one are rendered as ChatML, as llama.cpp renders them"
                    .to_owned(),
            };
            Err(Error::llama(
                ExcClass::ChatTemplateError,
                "MissingTemplate",
                Some(i64::from(code)),
                message,
            ))
        }
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
    fn longest_string_skips_arrays() {
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
        let mut header = Header::new(file.as_slice());
        header.scan().unwrap();
        assert_eq!(header.longest, "general.name".len() as u64);
        assert_eq!(header.duplicate_token, None);
    }

    #[test]
    fn finds_a_token_listed_twice() {
        let mut file = b"GGUF".to_vec();
        file.extend(3u32.to_le_bytes());
        file.extend(0u64.to_le_bytes());
        file.extend(1u64.to_le_bytes());
        file.extend(text("tokenizer.ggml.tokens"));
        file.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        file.extend(GGUF_TYPE_STRING.to_le_bytes());
        file.extend(3u64.to_le_bytes());
        for token in ["a", "b", "a"] {
            file.extend(text(token));
        }
        let mut header = Header::new(file.as_slice());
        header.scan().unwrap();
        assert_eq!(header.duplicate_token.as_deref(), Some("a"));
    }

    #[test]
    fn reads_the_tensor_types() {
        let mut file = b"GGUF".to_vec();
        file.extend(3u32.to_le_bytes());
        file.extend(2u64.to_le_bytes());
        file.extend(0u64.to_le_bytes());
        for (name, tensor_type) in [
            ("a", llama_cpp_sys_4::GGML_TYPE_F32),
            ("b", llama_cpp_sys_4::GGML_TYPE_I32),
        ] {
            file.extend(text(name));
            file.extend(2u32.to_le_bytes());
            file.extend(4u64.to_le_bytes());
            file.extend(8u64.to_le_bytes());
            file.extend(tensor_type.to_le_bytes());
            file.extend(0u64.to_le_bytes());
        }
        let mut header = Header::new(file.as_slice());
        let n_tensors = header.scan().unwrap();
        header.scan_tensors(n_tensors).unwrap();
        let expected = [llama_cpp_sys_4::GGML_TYPE_F32, llama_cpp_sys_4::GGML_TYPE_I32];
        assert_eq!(header.tensor_types.into_iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn truncated_header_is_an_error() {
        assert!(Header::new(&b"GGUF\x03\x00"[..]).scan().is_err());
    }
}
