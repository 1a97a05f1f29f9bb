//! A loaded GGUF model: the checks before llama.cpp reads its file (`load_checked`), and its
//! tokens as llama.cpp renders them. `LlamaModel`, its Python class, is in `python.rs`.

use std::path::Path;
use std::sync::Arc;

use llama_cpp_4::model::params::LlamaModelParams;
use llama_cpp_4::model::{LlamaModel, Special};
use llama_cpp_4::token::LlamaToken;
use llama_cpp_4::TokenToStringError;

use crate::backend::{backend, explained};
use crate::errors::{Error, Result};
use crate::metadata;
use crate::tokens::check_vocab;

/// What llama.cpp's vocabulary code aborts or throws across FFI on.
#[derive(Clone, Copy)]
pub enum VocabularyGap {
    /// No tokenizer and no token texts (vocabulary type NONE): `GGML_ASSERT`s in tokenization
    /// and in every token-to-text path.
    NoTokenizer,
    /// A SentencePiece vocabulary without a token for this byte: its tokenizer falls back to
    /// byte tokens with `std::map::at`, which throws through `llama_tokenize`.
    MissingByte(u8),
}

impl VocabularyGap {
    pub fn find(model: &LlamaModel) -> Option<Self> {
        let vocab = model.get_vocab();
        match vocab.vocab_type() {
            llama_cpp_sys_4::LLAMA_VOCAB_TYPE_NONE => Some(Self::NoTokenizer),
            llama_cpp_sys_4::LLAMA_VOCAB_TYPE_SPM => {
                let mut covered = [false; 256];
                for id in 0..model.n_vocab() {
                    if let Some(byte) = byte_token(vocab.get_text_bytes(LlamaToken::new(id)).unwrap_or_default()) {
                        covered[usize::from(byte)] = true;
                    }
                }
                (0..=u8::MAX)
                    .find(|&byte| !covered[usize::from(byte)])
                    .map(Self::MissingByte)
            }
            _ => None,
        }
    }

    pub fn error(self) -> Error {
        Error::value(match self {
            Self::NoTokenizer => {
                "this model has no tokenizer (vocabulary type NONE): it works with token ids only".to_owned()
            }
            Self::MissingByte(byte) => format!(
                "this model's SentencePiece vocabulary has no token for byte 0x{byte:02X}, which its \
                 tokenizer falls back on: it works with token ids only"
            ),
        })
    }
}

/// The byte a SentencePiece byte token such as `<0x0A>` (or a one-byte token) stands for.
fn byte_token(text: &[u8]) -> Option<u8> {
    if let &[byte] = text {
        return Some(byte);
    }
    let hex = text.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    let hex = std::str::from_utf8(hex).ok().filter(|hex| hex.len() == 2)?;
    u8::from_str_radix(hex, 16).ok()
}

/// Checks a single token id against the vocabulary.
pub fn token(model: &LlamaModel, id: i32) -> Result<LlamaToken> {
    check_vocab(&[id], model.n_vocab())?;
    Ok(LlamaToken::new(id))
}

/// llama.cpp asserts (aborts) when asked to add special tokens the vocabulary lacks, e.g.
/// a BOS it is configured to add but whose id was out of range in the file.
pub fn check_special_tokens(model: &LlamaModel) -> Result<()> {
    let wpm = model.get_vocab().vocab_type() == llama_cpp_sys_4::LLAMA_VOCAB_TYPE_WPM;
    let needed = [
        ("BOS", model.token_bos(), wpm || model.add_bos_token()),
        ("EOS", model.token_eos(), !wpm && model.add_eos_token()),
        ("SEP", model.token_sep(), wpm),
    ];
    match needed.iter().find(|(_, token, needed)| *needed && token.0 < 0) {
        Some((name, _, _)) => Err(Error::value(format!(
            "the tokenizer is set to add a {name} token the vocabulary does not have; use add_bos=False"
        ))),
        None => Ok(()),
    }
}

/// The piece llama.cpp renders for `id`. The crate's `token_to_bytes` blanks some
/// tokens by attribute and fails on pieces over 32 bytes; `token_to_raw_bytes` is
/// `llama_token_to_piece` itself, whose only "error" is an empty piece.
pub fn piece(model: &LlamaModel, id: i32, special: bool) -> Result<Vec<u8>> {
    match model.token_to_raw_bytes(token(model, id)?, self::special(special)) {
        Err(TokenToStringError::UnknownTokenType) => Ok(Vec::new()),
        other => Ok(other?),
    }
}

pub fn special(render: bool) -> Special {
    if render {
        Special::Tokenize
    } else {
        Special::Plaintext
    }
}

/// A local model file checked (`metadata::check_model_file`: before llama.cpp reads it) and
/// loaded with `params`, for Rust callers of the engine: the model, and whether it reads
/// learned position embeddings (the engine's `start`).
///
/// # Errors
///
/// `Error::Value` for a file the checks refuse or a vocabulary llama.cpp's tokenizer would
/// abort on; a load error when llama.cpp refuses the file.
pub fn load_checked(path: &Path, params: &LlamaModelParams) -> Result<(Arc<LlamaModel>, bool)> {
    let facts = metadata::check_model_file(path)?;
    let backend = backend()?;
    let model = explained(|| LlamaModel::load_from_file(backend, path, params))?;
    if let Some(gap) = VocabularyGap::find(&model) {
        return Err(gap.error());
    }
    Ok((Arc::new(model), facts.learned_positions))
}
