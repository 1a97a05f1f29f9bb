"""llamactx: llama.cpp's whole ``LlamaContext`` in Python, through the Rust crate llama-cpp-4.

Names mirror the crate (``LlamaModel``, ``LlamaContext``, ``LlamaBatch``, ``LlamaSampler``);
every crate error is a subclass of ``LlamaCppError``; logits come back as numpy arrays. No
input can crash the interpreter: bad arguments raise exceptions.
"""

import logging

from llamactx._cpu import CpuVariant, cpu_variant
from llamactx._cpu import load_extension as _load_extension

# Before any module below imports llamactx._llamactx: a wheel holds one build per CPU level.
_load_extension()

from llamactx._chat import ChatSession, chat
from llamactx._embedding import embed
from llamactx._engine import Delta, Engine, Request
from llamactx._enums import LlamaAttentionType, LlamaFlashAttnType, LlamaPoolingType, MtmdInputChunkType
from llamactx._generation import continue_sequence, generate, generate_batch, prefill, stream
from llamactx._llamactx import (
    ApplyChatTemplateError,
    AudioError,
    BatchAddError,
    ChatTemplateError,
    Completion,
    DecodeAborted,
    DecodeError,
    EmbeddingsError,
    EncodeError,
    EngineBusy,
    EngineStats,
    ImageError,
    KvCacheConversionError,
    LlamaBatch,
    LlamaContext,
    LlamaContextLoadError,
    LlamaCppError,
    LlamaLoraAdapter,
    LlamaLoraAdapterInitError,
    LlamaLoraAdapterRemoveError,
    LlamaLoraAdapterSetError,
    LlamaModel,
    LlamaModelLoadError,
    LlamaSampler,
    LlamaTokenData,
    LlamaTokenDataArray,
    LoadSessionError,
    MtmdBitmap,
    MtmdContext,
    MtmdError,
    MtmdInputChunk,
    MtmdInputChunks,
    NewLlamaChatMessageError,
    PerfContextData,
    RpcError,
    SamplerInitError,
    SamplingParams,
    SaveSessionError,
    SchemaError,
    ShimError,
    StateError,
    StringFromModelError,
    StringToTokenError,
    ThreadPool,
    TokenToStringError,
    __version__,
    serve_rpc,
)
from llamactx._logging import set_verbose
from llamactx._media import MediaBudget
from llamactx._models import default_model_path
from llamactx._reasoning import REASONING_FORMATS, Reasoning
from llamactx._render import PreparedChat
from llamactx._rerank import rerank
from llamactx._speculative import DraftModel, NgramDraft
from llamactx._structured import generate_json

# A library's logger: silent unless the application configures logging (no "last resort"
# printing of llama.cpp's warnings to stderr).
logging.getLogger("llamactx").addHandler(logging.NullHandler())

__all__ = [
    "REASONING_FORMATS",
    "ApplyChatTemplateError",
    "AudioError",
    "BatchAddError",
    "ChatSession",
    "ChatTemplateError",
    "Completion",
    "CpuVariant",
    "DecodeAborted",
    "DecodeError",
    "Delta",
    "DraftModel",
    "EmbeddingsError",
    "EncodeError",
    "Engine",
    "EngineBusy",
    "EngineStats",
    "ImageError",
    "KvCacheConversionError",
    "LlamaAttentionType",
    "LlamaBatch",
    "LlamaContext",
    "LlamaContextLoadError",
    "LlamaCppError",
    "LlamaFlashAttnType",
    "LlamaLoraAdapter",
    "LlamaLoraAdapterInitError",
    "LlamaLoraAdapterRemoveError",
    "LlamaLoraAdapterSetError",
    "LlamaModel",
    "LlamaModelLoadError",
    "LlamaPoolingType",
    "LlamaSampler",
    "LlamaTokenData",
    "LlamaTokenDataArray",
    "LoadSessionError",
    "MediaBudget",
    "MtmdBitmap",
    "MtmdContext",
    "MtmdError",
    "MtmdInputChunk",
    "MtmdInputChunkType",
    "MtmdInputChunks",
    "NewLlamaChatMessageError",
    "NgramDraft",
    "PerfContextData",
    "PreparedChat",
    "Reasoning",
    "Request",
    "RpcError",
    "SamplerInitError",
    "SamplingParams",
    "SaveSessionError",
    "SchemaError",
    "ShimError",
    "StateError",
    "StringFromModelError",
    "StringToTokenError",
    "ThreadPool",
    "TokenToStringError",
    "__version__",
    "chat",
    "continue_sequence",
    "cpu_variant",
    "default_model_path",
    "embed",
    "generate",
    "generate_batch",
    "generate_json",
    "prefill",
    "rerank",
    "serve_rpc",
    "set_verbose",
    "stream",
]
