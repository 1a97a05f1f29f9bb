"""llamactx: llama.cpp's whole ``LlamaContext`` in Python, through the Rust crate llama-cpp-4.

Names mirror the crate (``LlamaModel``, ``LlamaContext``, ``LlamaBatch``, ``LlamaSampler``);
every crate error is a subclass of ``LlamaCppError``; logits come back as numpy arrays. No
input can crash the interpreter: bad arguments raise exceptions.
"""

from llamactx._enums import LlamaAttentionType, LlamaFlashAttnType, LlamaPoolingType
from llamactx._llamactx import (
    ApplyChatTemplateError,
    BatchAddError,
    ChatTemplateError,
    DecodeAborted,
    DecodeError,
    EmbeddingsError,
    EncodeError,
    KvCacheConversionError,
    LlamaBatch,
    LlamaContext,
    LlamaContextLoadError,
    LlamaCppError,
    LlamaLoraAdapterInitError,
    LlamaLoraAdapterRemoveError,
    LlamaLoraAdapterSetError,
    LlamaModel,
    LlamaModelLoadError,
    LlamaSampler,
    LoadSessionError,
    NewLlamaChatMessageError,
    SaveSessionError,
    ShimError,
    StateError,
    StringFromModelError,
    StringToTokenError,
    TokenToStringError,
    __version__,
)
from llamactx.generate import generate, stream
from llamactx.models import default_model_path

__all__ = [
    "ApplyChatTemplateError",
    "BatchAddError",
    "ChatTemplateError",
    "DecodeAborted",
    "DecodeError",
    "EmbeddingsError",
    "EncodeError",
    "KvCacheConversionError",
    "LlamaAttentionType",
    "LlamaBatch",
    "LlamaContext",
    "LlamaContextLoadError",
    "LlamaCppError",
    "LlamaFlashAttnType",
    "LlamaLoraAdapterInitError",
    "LlamaLoraAdapterRemoveError",
    "LlamaLoraAdapterSetError",
    "LlamaModel",
    "LlamaModelLoadError",
    "LlamaPoolingType",
    "LlamaSampler",
    "LoadSessionError",
    "NewLlamaChatMessageError",
    "SaveSessionError",
    "ShimError",
    "StateError",
    "StringFromModelError",
    "StringToTokenError",
    "TokenToStringError",
    "__version__",
    "default_model_path",
    "generate",
    "stream",
]
