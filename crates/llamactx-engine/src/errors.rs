//! Everything that can go wrong in llamactx, as one Rust enum, and the classes of failure it
//! names (one per crate error enum, derived from `LlamaCppError`: the classes of the Python
//! exceptions). This crate needs no Python; the extension's `src/errors/python.rs` builds the
//! exception classes and turns an `Error` into one.

use std::fmt::Display;

use llama_cpp_4::context::kv_cache::KvCacheConversionError;
use llama_cpp_4::context::session::{LoadSessionError, SaveSessionError};
use llama_cpp_4::llama_batch::BatchAddError;
use llama_cpp_4::sampling::SamplerInitError;
use llama_cpp_4::{
    ApplyChatTemplateError, ChatTemplateError, DecodeError, EmbeddingsError, EncodeError, LlamaContextLoadError,
    LlamaLoraAdapterInitError, LlamaLoraAdapterRemoveError, LlamaLoraAdapterSetError, LlamaModelLoadError,
    NewLlamaChatMessageError, StringFromModelError, StringToTokenError, TokenToStringError,
};

/// The exception classes: `Name(Base[, ExtraBase]): "docstring";`, bases first. This list is
/// the one source of the classes; `tests/context/test_errors.py` checks that the package's `__all__`,
/// the stub and the API reference name the same ones.
macro_rules! exception_classes {
    ($($class:ident($base:ident $(, $extra:ident)?): $doc:literal;)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ExcClass {
            $($class),*
        }

        /// Each class of failure with its Python class's name, bases and docstring.
        pub const CLASSES: &[ClassSpec] = &[$(ClassSpec {
            class: ExcClass::$class,
            name: stringify!($class),
            base: ExcClass::$base,
            extra_base: exception_classes!(@extra $($extra)?),
            doc: $doc,
        }),*];
    };
    (@extra) => { None };
    (@extra $extra:ident) => { Some(BuiltinBase::$extra) };
}

/// A class of failure as Python sees it.
pub struct ClassSpec {
    pub class: ExcClass,
    pub name: &'static str,
    pub base: ExcClass,
    pub extra_base: Option<BuiltinBase>,
    pub doc: &'static str,
}

/// A built-in exception class some classes also derive from, so that `except ValueError`
/// (or `OverflowError`, `ConnectionError`) catches them.
#[derive(Debug, Clone, Copy)]
pub enum BuiltinBase {
    Overflow,
    Value,
    Connection,
}

exception_classes! {
    LlamaCppError(LlamaCppError):
        "Base class of every llamactx error. `kind` is the crate's variant name, `code` the \
         integer llama.cpp returned (or None).";
    DecodeError(LlamaCppError):
        "`llama_decode` failed (crate enum `DecodeError`).";
    DecodeAborted(DecodeError):
        "A decode was stopped by the abort callback or by Ctrl-C; the batch was rolled back.";
    EncodeError(LlamaCppError):
        "`llama_encode` failed (crate enum `EncodeError`).";
    EmbeddingsError(LlamaCppError):
        "Embeddings are not available (crate enum `EmbeddingsError`).";
    KvCacheConversionError(LlamaCppError, Overflow):
        "A sequence id or position does not fit llama.cpp's 32-bit integers.";
    SaveSessionError(LlamaCppError):
        "Writing a session file failed.";
    LoadSessionError(LlamaCppError):
        "Reading a session file failed.";
    LlamaModelLoadError(LlamaCppError):
        "llama.cpp could not load the model.";
    LlamaContextLoadError(LlamaCppError):
        "llama.cpp could not create the context.";
    LlamaLoraAdapterInitError(LlamaCppError):
        "llama.cpp could not load the LoRA adapter.";
    LlamaLoraAdapterSetError(LlamaCppError):
        "llama.cpp refused to set the LoRA adapter.";
    LlamaLoraAdapterRemoveError(LlamaCppError):
        "llama.cpp refused to remove the LoRA adapter.";
    BatchAddError(LlamaCppError):
        "The batch has no room for another token.";
    StringToTokenError(LlamaCppError):
        "Tokenization failed.";
    TokenToStringError(LlamaCppError):
        "Turning a token into text failed.";
    StringFromModelError(LlamaCppError):
        "A string could not be read from the model.";
    ChatTemplateError(LlamaCppError):
        "The model's chat template is missing or unreadable.";
    ApplyChatTemplateError(LlamaCppError):
        "Applying the chat template failed.";
    NewLlamaChatMessageError(LlamaCppError):
        "A chat message could not be built (NUL byte in role or content).";
    ShimError(LlamaCppError):
        "A call through the crate's C++ shim failed (crate enum `ShimError`), e.g. sampling.";
    SamplerInitError(LlamaCppError):
        "llama.cpp could not build a sampler (e.g. a grammar it cannot parse).";
    SchemaError(LlamaCppError, Value):
        "A JSON Schema or grammar that llguidance cannot compile, that admits no output, or \
         that failed while generating; nothing unconstrained is generated.";
    StateError(LlamaCppError):
        "A state function returned failure (`false` or `0`) without an error enum.";
    RpcError(LlamaCppError, Connection):
        "An RPC server could not be reached, speaks another protocol version, or failed while \
         the model used it; the message names its host:port. A model whose server failed \
         refuses further work: load it again.";
    MtmdError(LlamaCppError):
        "The multimodal projector failed (crate enum `MtmdError`): it could not be loaded, or \
         could not tokenize or encode the media.";
    ImageError(LlamaCppError, Value):
        "Image data that llamactx refuses before decoding it, or that does not decode: `kind` \
         is `NotAnImage`, `Animated`, `TooLarge`, `Empty` or `Corrupt`.";
    AudioError(LlamaCppError, Value):
        "Audio data that llamactx refuses or that does not decode: `kind` is `NotAudio`, \
         `Unsupported`, `TooLong`, `Empty` or `Corrupt`.";
    EngineBusy(LlamaCppError):
        "The engine's queue of waiting requests is full (`max_waiting`): retry later.";
}

/// Where `class` stands in `CLASSES` (their order is the enum's).
pub fn index_of(class: ExcClass) -> usize {
    class as usize
}

/// Everything that can go wrong in llamactx, before it becomes a Python exception.
#[derive(Debug)]
pub enum Error {
    /// An error of the llama-cpp-4 crate (or a failure it signals with a return value).
    Llama {
        class: ExcClass,
        kind: String,
        code: Option<i64>,
        message: String,
    },
    /// A decode stopped by the abort callback (`interrupted`: by Ctrl-C).
    Aborted { interrupted: bool },
    /// A bad argument: Python's `ValueError`.
    Value(String),
    /// An index out of range: Python's `IndexError`.
    Index(String),
    /// A wrong type: Python's `TypeError`.
    Type(String),
    /// A file that does not exist.
    FileNotFound(String),
    /// A call that can never be served (re-entrant use, a lock a fork left behind).
    Runtime(String),
    /// A lock poisoned by a panic in another thread.
    Poisoned(&'static str),
    /// A failure of the caller's own code (a Python callback's exception, in the extension),
    /// carried through unchanged: `python.rs` raises the same exception again.
    Foreign(Box<dyn std::error::Error + Send + Sync>),
    /// A Rust panic caught at the boundary: a bug of llamactx.
    Panic(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn value(message: impl Into<String>) -> Self {
        Self::Value(message.into())
    }

    pub fn index(message: impl Into<String>) -> Self {
        Self::Index(message.into())
    }

    pub fn closed(what: &str) -> Self {
        Self::Value(format!("{what} is closed"))
    }

    pub fn state(kind: &'static str, message: impl Into<String>) -> Self {
        Self::llama(ExcClass::StateError, kind, None, message)
    }

    /// An error of one of the crate-shaped classes: the variant name in `kind`, llama.cpp's
    /// return value (if any) in `code`.
    pub fn llama(class: ExcClass, kind: impl Into<String>, code: Option<i64>, message: impl Into<String>) -> Self {
        Self::Llama {
            class,
            kind: kind.into(),
            code,
            message: message.into(),
        }
    }

    /// Adds what llama.cpp logged while failing (see `backend::capture_errors`) to the message
    /// of a crate-shaped error; other errors already say what went wrong.
    #[must_use]
    pub fn with_logged_reason(self, logged: &str) -> Self {
        match self {
            Self::Llama {
                class,
                kind,
                code,
                message,
            } if !logged.is_empty() => Self::Llama {
                class,
                kind,
                code,
                message: format!("{message} (llama.cpp: {logged})"),
            },
            other => other,
        }
    }
}

macro_rules! map_error {
    ($enum:ty => $class:ident { $($pattern:pat => ($kind:literal, $code:expr)),+ $(,)? }) => {
        impl From<$enum> for Error {
            fn from(err: $enum) -> Self {
                #[allow(clippy::cast_possible_wrap, clippy::cast_lossless)]
                let (kind, code): (&'static str, Option<i64>) = match &err {
                    $($pattern => ($kind, $code)),+
                };
                Self::llama(ExcClass::$class, kind, code, err.to_string())
            }
        }
    };
}

map_error!(DecodeError => DecodeError {
    DecodeError::TensorCallback(_) => ("TensorCallback", None),
    DecodeError::NoKvCacheSlot => ("NoKvCacheSlot", Some(1)),
    DecodeError::NTokensZero => ("NTokensZero", Some(-1)),
    DecodeError::VetoedByDecodeHook => ("VetoedByDecodeHook", Some(-4)),
    DecodeError::Unknown(code) => ("Unknown", Some(*code as i64)),
});

map_error!(EncodeError => EncodeError {
    EncodeError::NoKvCacheSlot => ("NoKvCacheSlot", Some(1)),
    EncodeError::NTokensZero => ("NTokensZero", Some(-1)),
    EncodeError::Unknown(code) => ("Unknown", Some(*code as i64)),
});

map_error!(EmbeddingsError => EmbeddingsError {
    EmbeddingsError::NotEnabled => ("NotEnabled", None),
    EmbeddingsError::LogitsNotEnabled => ("LogitsNotEnabled", None),
    EmbeddingsError::NonePoolType => ("NonePoolType", None),
});

map_error!(KvCacheConversionError => KvCacheConversionError {
    KvCacheConversionError::SeqIdTooLarge(_) => ("SeqIdTooLarge", None),
    KvCacheConversionError::P0TooLarge(_) => ("P0TooLarge", None),
    KvCacheConversionError::P1TooLarge(_) => ("P1TooLarge", None),
});

map_error!(SaveSessionError => SaveSessionError {
    SaveSessionError::FailedToSave => ("FailedToSave", None),
    SaveSessionError::NullError(_) => ("NullError", None),
    SaveSessionError::PathToStrError(_) => ("PathToStrError", None),
});

map_error!(LoadSessionError => LoadSessionError {
    LoadSessionError::FailedToLoad => ("FailedToLoad", None),
    LoadSessionError::NullError(_) => ("NullError", None),
    LoadSessionError::PathToStrError(_) => ("PathToStrError", None),
    LoadSessionError::InsufficientMaxLength { n_out, .. } => ("InsufficientMaxLength", Some(*n_out as i64)),
});

map_error!(LlamaModelLoadError => LlamaModelLoadError {
    LlamaModelLoadError::NullError(_) => ("NullError", None),
    LlamaModelLoadError::NullResult => ("NullResult", None),
    LlamaModelLoadError::PathToStrError(_) => ("PathToStrError", None),
});

map_error!(llama_cpp_4::rpc::RpcError => RpcError {
    llama_cpp_4::rpc::RpcError::InitializationFailed { .. } => ("InitializationFailed", None),
    llama_cpp_4::rpc::RpcError::InvalidEndpoint { .. } => ("InvalidEndpoint", None),
    llama_cpp_4::rpc::RpcError::ConnectionFailed { .. } => ("ConnectionFailed", None),
    llama_cpp_4::rpc::RpcError::ServerError { .. } => ("ServerError", None),
    llama_cpp_4::rpc::RpcError::MemoryQueryFailed => ("MemoryQueryFailed", None),
    llama_cpp_4::rpc::RpcError::StringConversion(_) => ("StringConversion", None),
    llama_cpp_4::rpc::RpcError::Utf8Error(_) => ("Utf8Error", None),
    llama_cpp_4::rpc::RpcError::NotAvailable => ("NotAvailable", None),
});

map_error!(llama_cpp_4::mtmd::MtmdError => MtmdError {
    llama_cpp_4::mtmd::MtmdError::ContextCreateFailed => ("ContextCreateFailed", None),
    llama_cpp_4::mtmd::MtmdError::BitmapCreateFailed => ("BitmapCreateFailed", None),
    llama_cpp_4::mtmd::MtmdError::InvalidPath(_) => ("InvalidPath", None),
    llama_cpp_4::mtmd::MtmdError::PathNotUtf8 => ("PathNotUtf8", None),
    llama_cpp_4::mtmd::MtmdError::TokenizeError(code) => ("TokenizeError", Some(i64::from(*code))),
    llama_cpp_4::mtmd::MtmdError::EncodeError(code) => ("EncodeError", Some(i64::from(*code))),
    llama_cpp_4::mtmd::MtmdError::ChunkSaveFailed(code) => ("ChunkSaveFailed", Some(i64::from(*code))),
    llama_cpp_4::mtmd::MtmdError::ChunkLoadFailed => ("ChunkLoadFailed", None),
    llama_cpp_4::mtmd::MtmdError::BatchAddFailed(code) => ("BatchAddFailed", Some(i64::from(*code))),
    llama_cpp_4::mtmd::MtmdError::BatchCreateFailed => ("BatchCreateFailed", None),
    llama_cpp_4::mtmd::MtmdError::EvalError(code) => ("EvalError", Some(i64::from(*code))),
    llama_cpp_4::mtmd::MtmdError::VideoInitFailed => ("VideoInitFailed", None),
    llama_cpp_4::mtmd::MtmdError::VideoReadError(code) => ("VideoReadError", Some(i64::from(*code))),
});

map_error!(LlamaContextLoadError => LlamaContextLoadError {
    LlamaContextLoadError::NullReturn => ("NullReturn", None),
});

map_error!(LlamaLoraAdapterInitError => LlamaLoraAdapterInitError {
    LlamaLoraAdapterInitError::NullError(_) => ("NullError", None),
    LlamaLoraAdapterInitError::NullResult => ("NullResult", None),
    LlamaLoraAdapterInitError::PathToStrError(_) => ("PathToStrError", None),
    LlamaLoraAdapterInitError::FileOpen { .. } => ("FileOpen", None),
    LlamaLoraAdapterInitError::FileSeek { .. } => ("FileSeek", None),
});

map_error!(LlamaLoraAdapterSetError => LlamaLoraAdapterSetError {
    LlamaLoraAdapterSetError::ErrorResult(code) => ("ErrorResult", Some(*code as i64)),
});

map_error!(LlamaLoraAdapterRemoveError => LlamaLoraAdapterRemoveError {
    LlamaLoraAdapterRemoveError::ErrorResult(code) => ("ErrorResult", Some(*code as i64)),
});

map_error!(BatchAddError => BatchAddError {
    BatchAddError::InsufficientSpace(space) => ("InsufficientSpace", Some(*space as i64)),
});

map_error!(StringToTokenError => StringToTokenError {
    StringToTokenError::NulError(_) => ("NulError", None),
    StringToTokenError::InteriorNul(at) => ("InteriorNul", Some(*at as i64)),
    StringToTokenError::CIntConversionError(_) => ("CIntConversionError", None),
    StringToTokenError::NativeTokenCount { returned, .. } => ("NativeTokenCount", Some(*returned as i64)),
});

// `TokenToStringError` is `#[non_exhaustive]`: the one enum that needs a catch-all arm.
map_error!(TokenToStringError => TokenToStringError {
    TokenToStringError::UnknownTokenType => ("UnknownTokenType", None),
    TokenToStringError::InsufficientBufferSpace(needed) => ("InsufficientBufferSpace", Some(*needed as i64)),
    TokenToStringError::BufferCapacityExceeded(capacity) => ("BufferCapacityExceeded", Some(*capacity as i64)),
    TokenToStringError::NativePieceLength { returned, .. } => ("NativePieceLength", Some(*returned as i64)),
    TokenToStringError::FromUtf8Error(_) => ("FromUtf8Error", None),
    _ => ("Other", None),
});

map_error!(StringFromModelError => StringFromModelError {
    StringFromModelError::ReturnedError(code) => ("ReturnedError", Some(*code as i64)),
    StringFromModelError::Utf8Error(_) => ("Utf8Error", None),
});

map_error!(ChatTemplateError => ChatTemplateError {
    ChatTemplateError::BuffSizeError(needed) => ("BuffSizeError", Some(*needed as i64)),
    ChatTemplateError::MissingTemplate(code) => ("MissingTemplate", Some(*code as i64)),
    ChatTemplateError::Utf8Error(_) => ("Utf8Error", None),
});

map_error!(ApplyChatTemplateError => ApplyChatTemplateError {
    ApplyChatTemplateError::BuffSizeError => ("BuffSizeError", None),
    ApplyChatTemplateError::NulError(_) => ("NulError", None),
    ApplyChatTemplateError::FromUtf8Error(_) => ("FromUtf8Error", None),
});

map_error!(NewLlamaChatMessageError => NewLlamaChatMessageError {
    NewLlamaChatMessageError::NulError(_) => ("NulError", None),
});

map_error!(SamplerInitError => SamplerInitError {
    SamplerInitError::InteriorNul { .. } => ("InteriorNul", None),
    SamplerInitError::NullReturn(_) => ("NullReturn", None),
    SamplerInitError::TooManyDrySequenceBreakers { distinct, .. } => ("TooManyDrySequenceBreakers", Some(*distinct as i64)),
});

/// The crate's `ShimError` (from sampling) lives in a private module, so it cannot be named
/// and matched here; its variant name is read from its `Debug` form instead [llama.cpp internal].
pub fn shim_error(err: impl std::fmt::Debug + Display) -> Error {
    let debug = format!("{err:?}");
    let kind = debug.split(['(', ' ', '{']).next().unwrap_or("Unknown");
    Error::llama(ExcClass::ShimError, kind, None, err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(err: Error) -> (ExcClass, String, Option<i64>) {
        match err {
            Error::Llama { class, kind, code, .. } => (class, kind, code),
            other => panic!("not a crate error: {other:?}"),
        }
    }

    #[test]
    fn classes_are_listed_in_enum_order() {
        for (i, spec) in CLASSES.iter().enumerate() {
            assert_eq!(index_of(spec.class), i, "{}", spec.name);
            assert!(index_of(spec.base) < i || spec.class == ExcClass::LlamaCppError);
        }
    }

    #[test]
    fn decode_codes_and_kinds() {
        assert_eq!(
            parts(DecodeError::NoKvCacheSlot.into()),
            (ExcClass::DecodeError, "NoKvCacheSlot".to_owned(), Some(1))
        );
        assert_eq!(
            parts(DecodeError::Unknown(2).into()),
            (ExcClass::DecodeError, "Unknown".to_owned(), Some(2))
        );
        assert_eq!(
            parts(EncodeError::NTokensZero.into()),
            (ExcClass::EncodeError, "NTokensZero".to_owned(), Some(-1))
        );
    }

    #[test]
    fn each_enum_has_its_class() {
        assert_eq!(parts(EmbeddingsError::NotEnabled.into()).0, ExcClass::EmbeddingsError);
        assert_eq!(
            parts(LlamaModelLoadError::NullResult.into()).0,
            ExcClass::LlamaModelLoadError
        );
        assert_eq!(
            parts(LlamaContextLoadError::NullReturn.into()).0,
            ExcClass::LlamaContextLoadError
        );
        assert_eq!(
            parts(BatchAddError::InsufficientSpace(4).into()),
            (ExcClass::BatchAddError, "InsufficientSpace".to_owned(), Some(4))
        );
        assert_eq!(
            parts(SaveSessionError::FailedToSave.into()).0,
            ExcClass::SaveSessionError
        );
        assert_eq!(
            parts(LoadSessionError::FailedToLoad.into()).0,
            ExcClass::LoadSessionError
        );
        assert_eq!(
            parts(shim_error(std::fmt::Error)),
            (ExcClass::ShimError, "Error".to_owned(), None)
        );
        let too_large = i32::try_from(u64::MAX).unwrap_err();
        assert_eq!(
            parts(KvCacheConversionError::P0TooLarge(too_large).into()).1,
            "P0TooLarge"
        );
    }
}
