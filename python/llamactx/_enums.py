"""IntEnums with llama.cpp's values, accepted wherever the native module takes the int."""

from __future__ import annotations

import enum

__all__ = ["LlamaAttentionType", "LlamaFlashAttnType", "LlamaPoolingType", "MtmdInputChunkType"]


class LlamaPoolingType(enum.IntEnum):
    """How a context pools token embeddings into one per sequence (``llama_pooling_type``)."""

    UNSPECIFIED = -1
    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


class LlamaFlashAttnType(enum.IntEnum):
    """Whether a context uses flash attention (``llama_flash_attn_type``)."""

    AUTO = -1
    DISABLED = 0
    ENABLED = 1


class LlamaAttentionType(enum.IntEnum):
    """Causal or non-causal attention for embeddings (``llama_attention_type``)."""

    UNSPECIFIED = -1
    CAUSAL = 0
    NON_CAUSAL = 1


class MtmdInputChunkType(enum.IntEnum):
    """What a chunk of a multimodal prompt holds (``mtmd_input_chunk_type``)."""

    TEXT = 0
    IMAGE = 1
    AUDIO = 2
