"""Typed stubs of the native module ``llamactx._llamactx`` (checked by mypy.stubtest)."""

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, final

import numpy as np
import numpy.typing as npt

from llamactx._enums import LlamaPoolingType, MtmdInputChunkType
from llamactx._speculative import DraftModel, NgramDraft

__version__: str
#: The longest repeat `NgramDraft` looks for, and its longest draft.
_MAX_NGRAM: int
#: The longest draft `DraftModel` proposes.
_MAX_DRAFT: int
#: llama-server's `--reasoning-format` choices, as `_ChatTemplates.apply` takes them.
_REASONING_FORMATS: list[str]
#: Whether llama.cpp was compiled for the building machine (-march=native) rather than a CPU level.
NATIVE_BUILD: bool
__all__ = [
    "NATIVE_BUILD",
    "_MAX_DRAFT",
    "_MAX_NGRAM",
    "_REASONING_FORMATS",
    "ApplyChatTemplateError",
    "AudioError",
    "BatchAddError",
    "ChatTemplateError",
    "Completion",
    "DecodeAborted",
    "DecodeError",
    "EmbeddingsError",
    "EncodeError",
    "EngineBusy",
    "EngineStats",
    "ImageError",
    "KvCacheConversionError",
    "LlamaBatch",
    "LlamaContext",
    "LlamaContextLoadError",
    "LlamaCppError",
    "LlamaLoraAdapter",
    "LlamaLoraAdapterInitError",
    "LlamaLoraAdapterRemoveError",
    "LlamaLoraAdapterSetError",
    "LlamaModel",
    "LlamaModelLoadError",
    "LlamaSampler",
    "LlamaTokenData",
    "LlamaTokenDataArray",
    "LoadSessionError",
    "MtmdBitmap",
    "MtmdContext",
    "MtmdError",
    "MtmdInputChunk",
    "MtmdInputChunks",
    "NewLlamaChatMessageError",
    "PerfContextData",
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
    "_ChatApplied",
    "_ChatTemplates",
    "_ContextLoop",
    "_EngineCore",
    "_Regex",
    "_RequestCore",
    "_Waker",
    "__version__",
    "_check_constraint_size",
    "_check_media_ending",
    "_check_prompt",
    "_check_reasoning",
    "_check_speculative",
    "_check_template_variables",
    "_gpu_devices",
    "_rerank_prompt",
    "_vocabulary_ids",
    "cpu_features",
    "serve_rpc",
]

_Tokens = Sequence[int] | npt.NDArray[np.integer]
_Path = str | os.PathLike[str]
_Bytes = bytes | bytearray | memoryview
_ChatMessage = tuple[str, str] | Mapping[str, str]

class LlamaCppError(Exception):
    """Base class of every llamactx error. `kind` is the crate's variant name, `code` the integer llama.cpp
    returned (or None).
    """

    kind: str | None
    code: int | None

class DecodeError(LlamaCppError):
    """`llama_decode` failed (crate enum `DecodeError`)."""

class DecodeAborted(DecodeError):
    """A decode was stopped by the abort callback or by Ctrl-C; the batch was rolled back."""

class EncodeError(LlamaCppError):
    """`llama_encode` failed (crate enum `EncodeError`)."""

class EmbeddingsError(LlamaCppError):
    """Embeddings are not available (crate enum `EmbeddingsError`)."""

class KvCacheConversionError(LlamaCppError, OverflowError):
    """A sequence id or position does not fit llama.cpp's 32-bit integers."""

class SaveSessionError(LlamaCppError):
    """Writing a session file failed."""

class LoadSessionError(LlamaCppError):
    """Reading a session file failed."""

class LlamaModelLoadError(LlamaCppError):
    """llama.cpp could not load the model."""

class LlamaContextLoadError(LlamaCppError):
    """llama.cpp could not create the context."""

class LlamaLoraAdapterInitError(LlamaCppError):
    """llama.cpp could not load the LoRA adapter."""

class LlamaLoraAdapterSetError(LlamaCppError):
    """llama.cpp refused to set the LoRA adapter."""

class LlamaLoraAdapterRemoveError(LlamaCppError):
    """llama.cpp refused to remove the LoRA adapter."""

class BatchAddError(LlamaCppError):
    """The batch has no room for another token."""

class StringToTokenError(LlamaCppError):
    """Tokenization failed."""

class TokenToStringError(LlamaCppError):
    """Turning a token into text failed."""

class StringFromModelError(LlamaCppError):
    """A string could not be read from the model."""

class ChatTemplateError(LlamaCppError):
    """The model's chat template is missing or unreadable."""

class ApplyChatTemplateError(LlamaCppError):
    """Applying the chat template failed."""

class NewLlamaChatMessageError(LlamaCppError):
    """A chat message could not be built (NUL byte in role or content)."""

class ShimError(LlamaCppError):
    """A call through the crate's C++ shim failed (crate enum `ShimError`), e.g. sampling."""

class SamplerInitError(LlamaCppError):
    """llama.cpp could not build a sampler (e.g. a grammar it cannot parse)."""

class SchemaError(LlamaCppError, ValueError):
    """A JSON Schema or grammar that llguidance cannot compile, that admits no output, or that failed while
    generating; nothing unconstrained is generated.
    """

class StateError(LlamaCppError):
    """A state function returned failure (`false` or `0`) without an error enum."""

class RpcError(LlamaCppError, ConnectionError):
    """An RPC server could not be reached, speaks another protocol version, or failed while the model used it;
    the message names its host:port. A model whose server failed refuses further work: load it again.
    """

class MtmdError(LlamaCppError):
    """The multimodal projector failed (crate enum `MtmdError`): it could not be loaded, or could not tokenize or
    encode the media.
    """

class AudioError(LlamaCppError, ValueError):
    """Audio data that llamactx refuses or that does not decode: `kind` is `NotAudio`, `Unsupported`, `TooLong`,
    `Empty` or `Corrupt`.
    """

class ImageError(LlamaCppError, ValueError):
    """Image data that llamactx refuses before decoding it, or that does not decode: `kind` is `NotAnImage`,
    `Animated`, `TooLarge`, `Empty` or `Corrupt`.
    """

class EngineBusy(LlamaCppError):
    """The engine's queue of waiting requests is full (`max_waiting`): retry later."""

@final
class LlamaModel:
    """A model loaded from a GGUF file. Shared by every context made from it, and kept alive by
    them: closing or deleting the Python object while contexts exist is safe.
    """

    @classmethod
    def load_from_file(
        cls,
        path: _Path,
        *,
        n_gpu_layers: int | None = None,
        main_gpu: int | None = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        rpc_servers: Sequence[str] | None = None,
        rpc_timeout: float = 60.0,
    ) -> LlamaModel:
        """Loads a GGUF model. Releases the GIL while loading.

        `n_gpu_layers` layers are offloaded to a GPU when llama.cpp was built with one, or to the
        `rpc_servers` (`"host:port"` of `llamactx rpc-server`s, filled in order); by default none
        locally and every layer with RPC servers. `rpc_timeout` (seconds) bounds every connection
        to them and every answer awaited from them. `vocab_only` loads only the tokenizer.
        `use_mmap`/`use_mlock` choose how the weights are read. llama-cpp-4 0.11 cannot pass a
        progress callback to llama.cpp, so there is none. Raises `FileNotFoundError` for a
        missing file, `ValueError` for a path that is not UTF-8 or holds a NUL byte,
        `RpcError` for an RPC server that is unreachable, busy, of another protocol version or
        failing while the weights go to it, and `LlamaModelLoadError` when llama.cpp refuses
        the file.
        """
    def devices(self) -> list[dict[str, Any]]:
        """Where the model's weights went: a dict per part, `{"name", "kind", "endpoint",
        "weight_bytes"}`. `kind` is "rpc" for an RPC server (`endpoint` is its host:port, `name`
        its devices, `weight_bytes` what the loader allocated there), then "cpu" for this machine
        (`weight_bytes` is None for a model split across servers: llama.cpp does not report it).
        A model without RPC servers has one part, the CPU, with all its weights.
        """
    def new_context(
        self,
        *,
        n_ctx: int | None = None,
        n_batch: int | None = None,
        n_ubatch: int | None = None,
        n_seq_max: int | None = None,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        embeddings: bool | None = None,
        pooling_type: int | None = None,
        flash_attn_type: int | None = None,
        attention_type: int | None = None,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        offload_kqv: bool | None = None,
        kv_unified: bool | None = None,
        swa_full: bool | None = None,
        op_offload: bool | None = None,
        no_perf: bool | None = None,
        rope_freq_base: float | None = None,
        rope_freq_scale: float | None = None,
    ) -> LlamaContext:
        """Creates a context (KV cache, compute buffers) on this model. Releases the GIL.

        Keywords are the crate's `LlamaContextParams::with_*` builders without `with_`; `None`
        keeps llama.cpp's default. `pooling_type`, `flash_attn_type` and `attention_type` take
        the matching IntEnum or its int value; `cache_type_k`/`cache_type_v` take a ggml type
        name such as `"f16"` or `"q8_0"`. `TypeError` for an unknown keyword (it lists them);
        `ValueError` for values llama.cpp would abort on, and for a model loaded with
        `vocab_only=True` (it has no weights to compute with).
        """
    def str_to_token(self, text: str, add_bos: bool = True, *, special: bool = True) -> list[int]:
        """Tokenizes `text`. `add_bos` adds the BOS (and EOS) tokens where the model's tokenizer
        is configured to add them (llama.cpp's `add_special`; see `add_bos_token()`);
        `special` parses special tokens such as `<|im_start|>` written in the text (the
        crate's default). Releases the GIL.
        """
    def token_to_str(self, token: int, special: bool = True) -> str:
        """The text of one token. `special=True` renders special tokens (e.g. `<|im_end|>`),
        `False` renders them as empty text. Raises `TokenToStringError` for a token whose
        bytes are not valid UTF-8 on their own; use `token_to_bytes` for those.
        """
    def token_to_bytes(self, token: int, special: bool = True) -> bytes:
        """The raw bytes of one token (a multi-byte character may be split across tokens)."""
    def detokenize(self, tokens: _Tokens, remove_special: bool = False, unparse_special: bool = False) -> str:
        """Turns tokens back into text. `remove_special` drops BOS/EOS where the model adds them;
        `unparse_special` renders special tokens as text. Releases the GIL.
        """
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
    def n_embd(self) -> int:
        """Width of the model's embeddings."""
    def n_layer(self) -> int:
        """Number of layers."""
    def n_head(self) -> int:
        """Number of attention heads."""
    def n_ctx_train(self) -> int:
        """Context length the model was trained with."""
    def n_params(self) -> int:
        """Number of parameters."""
    def model_size(self) -> int:
        """Size of the weights in bytes."""
    def token_bos(self) -> int:
        """Beginning-of-sequence token."""
    def token_eos(self) -> int:
        """End-of-sequence token."""
    def token_eot(self) -> int:
        """End-of-turn token (-1 when the model has none)."""
    def token_nl(self) -> int:
        """Newline token."""
    def is_eog_token(self, token: int) -> bool:
        """Whether `token` ends generation (EOS, EOT, ...)."""
    def add_bos_token(self) -> bool:
        """Whether the tokenizer adds a BOS token."""
    def has_encoder(self) -> bool:
        """Whether the model has an encoder (T5-style), i.e. supports `LlamaContext.encode`."""
    def has_decoder(self) -> bool:
        """Whether the model has a decoder."""
    def is_recurrent(self) -> bool:
        """Whether the model is recurrent (Mamba, RWKV): its state per sequence cannot be cut back to
        an earlier position.
        """
    def is_hybrid(self) -> bool:
        """Whether the model mixes recurrent and attention layers (Jamba, Granite 4): its state per
        sequence cannot be cut back to an earlier position either.
        """
    def meta_val_str(self, key: str) -> str:
        """The value of one metadata key, as text; `StringFromModelError` when it is missing."""
    def meta_count(self) -> int:
        """Number of metadata entries (arrays excluded, as llama.cpp does)."""
    def metadata(self) -> dict[str, str]:
        """All metadata as a `dict` of text values."""
    def desc(self) -> str:
        """A short description of the model (architecture, size, quantization)."""
    def get_chat_template(self, name: str | None = None) -> str:
        """The model's chat template (a Jinja string), or its template named `name` (GGUF's
        `tokenizer.chat_template.NAME`, e.g. a reranker's "rerank"); `ChatTemplateError` when it
        has none.
        """
    def n_cls_out(self) -> int:
        """Number of outputs of the model's classification head (a reranker's scores per sequence
        under `LlamaPoolingType.RANK`); 1 for a model without one.
        """
    def cls_label(self, index: int) -> str:
        """The label of output `index` of the classification head; `IndexError` when the model
        names none there.
        """
    def lora_adapter_init(self, path: _Path) -> LlamaLoraAdapter:
        """Loads a LoRA adapter (GGUF) made for this model. Releases the GIL.
        `LlamaLoraAdapterInitError` when llama.cpp refuses the file, and for tensors of a type no
        CPU kernel multiplies (`kind == "UnsupportedTensorType"`).
        """
    def apply_chat_template(
        self, messages: Sequence[_ChatMessage], tmpl: str | None = None, add_ass: bool = True
    ) -> str:
        """Formats `messages` (a sequence of `(role, content)` pairs or of dicts with `role` and
        `content`) with the model's template, or with `tmpl` when given; `add_ass` ends the
        prompt with the assistant's turn opener. llama.cpp applies the template with its
        built-in formats, not a full Jinja engine.
        """
    @property
    def path(self) -> Path:
        """Path of the GGUF file."""
    def close(self) -> None:
        """Drops this object's hold on the native model. Contexts made from it keep it alive until
        they close; every later call on this object raises `ValueError`.
        """
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    def __enter__(self) -> LlamaModel: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

@final
class LlamaContext:
    """A llama.cpp context: KV cache, compute buffers and outputs of one model.

    Every method takes the context's lock with the GIL released, so threads sharing a context
    are serialised and other Python threads keep running meanwhile.
    """

    @property
    def model(self) -> LlamaModel:
        """The `LlamaModel` this context was made from."""
    def n_ctx(self) -> int:
        """Size of the context (KV cells), as llama.cpp padded it."""
    def n_ctx_seq(self) -> int:
        """Context size available to each sequence."""
    def n_batch(self) -> int:
        """Most tokens one `decode` call accepts."""
    def n_ubatch(self) -> int:
        """Physical micro-batch size."""
    def n_seq_max(self) -> int:
        """Number of sequences the context holds."""
    def n_threads(self) -> int:
        """Threads used for single-token decoding."""
    def n_threads_batch(self) -> int:
        """Threads used for batch (prompt) decoding."""
    def decode(self, batch: LlamaBatch) -> None:
        """Runs the model on `batch`, filling the KV cache and, for tokens added with
        `logits=True`, the output rows. Releases the GIL. Raises `ValueError` for a batch
        this context cannot take (too many tokens, unknown token or sequence ids) or before the
        first `encode` of an encoder-decoder model, and
        `DecodeError` when llama.cpp fails (e.g. `kind == "NoKvCacheSlot"` when the cache is full).
        """
    def encode(self, batch: LlamaBatch) -> None:
        """Runs the encoder on `batch` (T5-style models, or embedding models without a KV cache).
        Raises `ValueError` on a decoder-only model, where llama.cpp would crash, and for more
        tokens than `n_ubatch`; `EncodeError` when llama.cpp fails.
        """
    def synchronize(self) -> None:
        """Waits until llama.cpp has finished all queued computation."""
    def set_warmup(self, warmup: bool) -> None:
        """Marks the next decodes as warm-up runs (they load every weight, as with an empty batch)."""
    def set_causal_attn(self, causal_attn: bool) -> None:
        """Switches causal attention on or off. Without it, a decode may hold at most `n_ubatch`
        tokens.
        """
    def set_embeddings(self, embeddings: bool) -> None:
        """Switches embedding output on or off. With it, a decode may hold at most `n_ubatch`
        tokens. `ValueError` where llama.cpp cannot pool them (see `new_context`).
        """
    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Sets the threads for single-token and for batch decoding (each from 1 to the CPUs this
        process may use: ggml threads spin, so more run many times slower).
        """
    def pooling_type(self) -> LlamaPoolingType:
        """How the context pools embeddings, as a `LlamaPoolingType`."""
    def clear_kv_cache(self) -> None:
        """Removes every token of every sequence from the KV cache (nothing to do for models
        without one).
        """
    def get_logits(self) -> npt.NDArray[np.float32]:
        """Logits of the first output row, a new float32 array of shape `(n_vocab,)`.
        `IndexError` when no row has logits.
        """
    def get_logits_ith(self, i: int) -> npt.NDArray[np.float32]:
        """Logits of batch row `i` (negative `i` counts from the last output), a new float32
        array of shape `(n_vocab,)`. `IndexError` if row `i` has no logits.
        """
    def candidates(self) -> LlamaTokenDataArray:
        """Every token of the first output row as a `LlamaTokenDataArray` (unsorted, p = 0)."""
    def candidates_ith(self, i: int) -> LlamaTokenDataArray:
        """Every token of batch row `i` as a `LlamaTokenDataArray`. `IndexError` if row `i` has
        no logits.
        """
    def token_data_array(self) -> LlamaTokenDataArray:
        """The crate's `token_data_array`: the candidates of the first output row."""
    def get_embeddings(self) -> npt.NDArray[np.float32]:
        """Token embeddings of every output row, a new float32 array `(n_outputs, n_embd)`.
        `EmbeddingsError` when embeddings are off, the context pools them, or no row has outputs.
        """
    def embeddings_ith(self, i: int) -> npt.NDArray[np.float32]:
        """Token embedding of batch row `i` (negative counts from the last output), a new float32
        array `(n_embd,)`. `EmbeddingsError` when embeddings are off, pooled, or the row has
        no output.
        """
    def embeddings_seq_ith(self, seq: int) -> npt.NDArray[np.float32]:
        """Pooled embedding of sequence `seq` from the last batch (for RANK pooling: its scores),
        a new float32 array. `EmbeddingsError` when embeddings are off, the context does not
        pool, or `seq` was not in the last batch.
        """
    def get_sampled_token_ith(self, i: int) -> int:
        """The token the backend sampler picked for batch row `i`. `IndexError` without a backend
        sampler, for a row without output, or when that row's sequence has no sampler.
        """
    def get_sampled_candidates_ith(self, i: int) -> npt.NDArray[np.int32]:
        """The candidate token ids the backend sampler kept for row `i`, a new int32 array."""
    def get_sampled_logits_count_ith(self, i: int) -> int:
        """Number of logits the backend sampler kept for row `i`."""
    def get_sampled_logits_ith(self, i: int) -> npt.NDArray[np.float32]:
        """The logits the backend sampler kept for row `i`, a new float32 array."""
    def get_sampled_probs_count_ith(self, i: int) -> int:
        """Number of probabilities the backend sampler kept for row `i`."""
    def get_sampled_probs_ith(self, i: int) -> npt.NDArray[np.float32]:
        """The probabilities the backend sampler kept for row `i`, a new float32 array."""
    def save_session_file(self, path: _Path, tokens: _Tokens) -> None:
        """Writes the whole state (KV memory) and `tokens` to a session file. `SaveSessionError`
        when llama.cpp cannot write it.
        """
    def load_session_file(self, path: _Path, max_tokens: int) -> list[int]:
        """Restores a session file; returns its tokens (at most `max_tokens`). No row has logits
        afterwards. `LoadSessionError` for a file that is not a session file or holds more than
        `max_tokens` tokens; `StateError` for a state this context refuses.
        """
    def get_state_size(self) -> int:
        """Size in bytes of the whole state (`state_get_size` under its older name)."""
    def state_get_size(self) -> int:
        """Size in bytes of the whole state."""
    def copy_state_data(self) -> bytes:
        """The whole state as `bytes` (the safe form of the crate's `copy_state_data`)."""
    def state_get_data(self) -> bytes:
        """The whole state as `bytes`. `StateError` if llama.cpp writes nothing."""
    def set_state_data(self, src: _Bytes) -> int:
        """Restores a state from a bytes-like object (the safe form of the crate's
        `set_state_data`); returns the bytes read. `StateError` when llama.cpp rejects it.
        """
    def state_set_data(self, src: _Bytes) -> int:
        """Restores a state from a bytes-like object; returns the bytes read. No row has logits
        afterwards. `StateError` when llama.cpp rejects the data.
        """
    def state_save_file(self, path: _Path, tokens: _Tokens) -> bool:
        """Writes the whole state and `tokens` to `path`; returns True. `StateError` on failure."""
    def state_load_file(self, path: _Path, n_token_capacity: int) -> list[int]:
        """Restores the whole state from `path`; returns the tokens saved with it (at most
        `n_token_capacity`). No row has logits afterwards. `StateError` on failure.
        """
    def state_seq_get_size(self, seq_id: int) -> int:
        """Size in bytes of sequence `seq_id`'s state."""
    def state_seq_get_size_ext(self, seq_id: int, flags: int) -> int:
        """Size in bytes of sequence `seq_id`'s state with `flags` (0 or
        `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`).
        """
    def state_seq_get_data(self, seq_id: int) -> bytes:
        """Sequence `seq_id`'s state as `bytes`. `StateError` if llama.cpp writes nothing
        (e.g. an empty sequence).
        """
    def state_seq_get_data_ext(self, seq_id: int, flags: int) -> bytes:
        """Sequence `seq_id`'s state with `flags`, as `bytes`."""
    def state_seq_set_data(self, src: _Bytes, dest_seq_id: int) -> int:
        """Restores a sequence state into `dest_seq_id`; returns the bytes read. No row has
        logits afterwards. `StateError` when llama.cpp rejects the data.
        """
    def state_seq_set_data_ext(self, src: _Bytes, dest_seq_id: int, flags: int) -> int:
        """`state_seq_set_data` with `flags`."""
    def state_seq_save_file(self, path: _Path, seq_id: int, tokens: _Tokens) -> int:
        """Writes sequence `seq_id`'s state and `tokens` to `path`; returns the bytes written.
        `StateError` on failure.
        """
    def state_seq_load_file(self, path: _Path, dest_seq_id: int, n_token_capacity: int) -> list[int]:
        """Restores a sequence state file into `dest_seq_id`; returns its tokens (at most
        `n_token_capacity`). No row has logits afterwards. `StateError` on failure.
        """
    def lora_adapter_set(self, adapter: LlamaLoraAdapter, scale: float) -> None:
        """Applies `adapter` with weight `scale` (0 leaves the model unchanged). Replaces any
        adapter set before, as the crate does; the context keeps the adapter alive while set.
        `ValueError` for an adapter of another model; `LlamaLoraAdapterSetError` on failure.
        """
    def lora_adapter_remove(self, adapter: LlamaLoraAdapter) -> None:
        """Removes the adapter set on this context (the crate clears every adapter).
        `ValueError` when `adapter` is not the one set.
        """
    def set_adapter_cvec(self, data: npt.ArrayLike | None, n_embd: int, il_start: int, il_end: int) -> None:
        """Adds control vector `data` (per layer 1.., `n_embd` floats each; a 2-D array is
        flattened) to the layers `il_start..=il_end`. Empty or `None` data clears it.
        `ValueError` when `n_embd` is not the model's.
        """
    def set_abort_callback(self, callback: Callable[[], object] | None) -> None:
        """Sets `callback()` to be polled while llama.cpp computes (about every 5 ms, on the
        decoding thread); a truthy result stops the decode, which then raises `DecodeAborted`
        and leaves nothing of the batch in the KV cache. An exception in the callback also
        stops it and is re-raised. `None` removes the callback (Ctrl-C still interrupts).
        """
    def attach_threadpool(self, threadpool: ThreadPool, threadpool_batch: ThreadPool | None = None) -> None:
        """Runs computation on `threadpool` (and batches on `threadpool_batch`, default the same
        pool) instead of the pools that contexts share by default. The context keeps the pools
        alive until `detach_threadpool` or close; a pool serves one context at a time.
        """
    def detach_threadpool(self) -> None:
        """Releases the attached pools and goes back to the shared ones."""
    def set_sampler(self, seq_id: int, sampler: LlamaSampler | None) -> bool:
        """Samples sequence `seq_id` inside llama.cpp's graph (backend sampling) with a copy of
        `sampler` (wrapped in a chain if it is not one), kept by the context; `None` removes
        it. Returns True; `StateError` when llama.cpp cannot run that sampler on the backend.
        While any backend sampler is set, read results with the `get_sampled_*` methods:
        full logits rows are not available.
        """
    def timings(self) -> PerfContextData:
        """Performance counters since the context started or since `perf_context_reset`."""
    def reset_timings(self) -> None:
        """Resets ggml's clock (the crate's `reset_timings`)."""
    def perf_context_reset(self) -> None:
        """Zeroes the performance counters."""
    def memory_breakdown_print(self) -> None:
        """Logs the memory each buffer type uses (to the `llamactx` logger)."""
    def memory_breakdown(self) -> list[dict[str, Any]]:
        """Memory per buffer type: a list of dicts with `buft_name`, `model`, `context`,
        `compute` and `total` (bytes).
        """
    def get_model_ptr(self) -> int:
        """Address of the native `llama_model`, for FFI interop only."""
    def as_ptr(self) -> int:
        """Address of the native `llama_context`, for FFI interop only: valid until `close()`."""
    def copy_cache(self, src: int, dest: int, size: int) -> None:
        """Copies the first `size` positions of sequence `src` to sequence `dest`."""
    def copy_kv_cache_seq(self, src: int, dest: int, p0: int | None = None, p1: int | None = None) -> None:
        """Copies the cells of sequence `src` between positions `p0` and `p1` (`None`: open end)
        to sequence `dest`, which then continues exactly like `src`.
        """
    def clear_kv_cache_seq(self, src: int | None = None, p0: int | None = None, p1: int | None = None) -> bool:
        """Removes the cells of sequence `src` (all sequences for `None`) between positions `p0`
        and `p1`. Returns False when llama.cpp cannot remove part of a sequence (recurrent
        models).
        """
    def llama_kv_cache_seq_keep(self, seq_id: int) -> None:
        """Removes every sequence except `seq_id`. (With a KV stream per sequence, llama.cpp's
        own call only reaches `seq_id`'s stream; the other sequences are cleared as well, so
        the result is the same in both layouts.)
        """
    def kv_cache_seq_add(self, seq_id: int, p0: int | None, p1: int | None, delta: int) -> None:
        """Adds `delta` to the positions of sequence `seq_id` in `[p0, p1)` (`None`: open end).
        `ValueError` when the cache cannot shift.
        """
    def kv_cache_seq_div(self, seq_id: int, p0: int | None, p1: int | None, d: int) -> None:
        """Divides the positions of sequence `seq_id` in `[p0, p1)` by `d` (1..=255)."""
    def kv_cache_seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for `seq_id`, or -1 when the sequence is empty."""
    def memory_seq_pos_min(self, seq_id: int) -> int:
        """Smallest position held for `seq_id`, or -1 when the sequence is empty."""
    def memory_can_shift(self) -> bool:
        """Whether the KV cache supports shifting positions (`kv_cache_seq_add`/`_div`)."""
    def close(self) -> None:
        """Frees the native context now. Later calls raise `ValueError`."""
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    def __enter__(self) -> LlamaContext: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

@final
class LlamaBatch:
    """A batch of tokens for `LlamaContext.decode`/`encode`: `LlamaBatch(n_tokens, n_seq_max=1)`
    holds up to `n_tokens` tokens, each in up to `n_seq_max` sequences.
    """

    def __new__(cls, n_tokens: int, n_seq_max: int = 1) -> LlamaBatch: ...
    def add(self, token: int, pos: int, seq_ids: Sequence[int], logits: bool) -> None:
        """Appends one token at position `pos` of each sequence in `seq_ids`; `logits` asks for
        its output row. Raises `BatchAddError` when the batch is full.
        """
    def add_sequence(self, tokens: _Tokens, seq_id: int, logits_all: bool) -> None:
        """Appends `tokens` to sequence `seq_id` at positions 0, 1, ...; the last token always
        gets logits, the others when `logits_all`.
        """
    def clear(self) -> None:
        """Empties the batch (its allocation is kept)."""
    def n_tokens(self) -> int:
        """Number of tokens in the batch."""
    def __len__(self) -> int: ...

@final
class LlamaSampler:
    """A llama.cpp sampler (or chain of samplers) that picks the next token from logits."""

    @staticmethod
    def greedy() -> LlamaSampler:
        """Always picks the most likely token."""
    @staticmethod
    def dist(seed: int) -> LlamaSampler:
        """Picks a token at random by its probability, from a generator seeded with `seed`."""
    @staticmethod
    def temp(t: float) -> LlamaSampler:
        """Divides the logits by temperature `t` (`t` below 1e-6 keeps only the most likely token)."""
    @staticmethod
    def top_k(k: int) -> LlamaSampler:
        """Keeps the `k` most likely tokens (`k <= 0` keeps all)."""
    @staticmethod
    def top_p(p: float, min_keep: int = 1) -> LlamaSampler:
        """Keeps the most likely tokens whose probabilities add up to `p` (at least `min_keep`)."""
    @staticmethod
    def min_p(p: float, min_keep: int = 1) -> LlamaSampler:
        """Keeps tokens at least `p` times as likely as the most likely one (at least `min_keep`)."""
    @staticmethod
    def temp_ext(t: float, delta: float, exponent: float) -> LlamaSampler:
        """Temperature with dynamic range: `t` adjusted by entropy within `delta`, `exponent` (`t`
        below 1e-6 keeps only the most likely token).
        """
    @staticmethod
    def typical(p: float, min_keep: int = 1) -> LlamaSampler:
        """Locally typical sampling with mass `p` (at least `min_keep` tokens)."""
    @staticmethod
    def xtc(p: float, t: float, min_keep: int = 1, seed: int = 0) -> LlamaSampler:
        """XTC: with probability `p`, removes the top tokens above threshold `t`."""
    @staticmethod
    def top_n_sigma(n: float) -> LlamaSampler:
        """Keeps tokens within `n` standard deviations of the top logit."""
    @staticmethod
    def mirostat(n_vocab: int, seed: int, tau: float, eta: float, m: int) -> LlamaSampler:
        """Mirostat 1.0 with target surprise `tau`, learning rate `eta` and `m` tokens for its
        estimate.
        """
    @staticmethod
    def mirostat_v2(seed: int, tau: float, eta: float) -> LlamaSampler:
        """Mirostat 2.0 with target surprise `tau` and learning rate `eta`."""
    @staticmethod
    def adaptive_p(target: float, decay: float, seed: int) -> LlamaSampler:
        """Adaptive-p: steers toward tokens of probability `target`, with history `decay`."""
    @staticmethod
    def penalties(
        n_vocab: int, penalty_last_n: int, penalty_repeat: float, penalty_freq: float, penalty_present: float
    ) -> LlamaSampler:
        """Repetition penalties over the last `penalty_last_n` tokens (0 disables them; at most
        2**20). `ValueError` for -1, which means "the context size" only on llama.cpp's command
        line: the sampler itself would penalise nothing.
        """
    @staticmethod
    def logit_bias(n_vocab: int, biases: Sequence[tuple[int, float]]) -> LlamaSampler:
        """Adds `bias` to the logits of given tokens: `biases` is a sequence of `(token, bias)`."""
    @staticmethod
    def grammar(model: LlamaModel, grammar: str, root: str = "root") -> LlamaSampler:
        """Constrains tokens to the GBNF `grammar`, starting at rule `root`, with llama.cpp's own
        grammar engine (the crate's sampler). Its work per token is unbounded for ambiguous
        grammars (one stack per partial parse), so a grammar from outside the program belongs
        in `llguidance(model, "gbnf", grammar)`, which every `grammar=` argument uses. Keeps
        `model` alive. `SamplerInitError` for a grammar llama.cpp cannot parse.
        """
    @staticmethod
    def llguidance(model: LlamaModel, kind: str, data: str) -> LlamaSampler:
        """Constrains tokens to `data` with llguidance, compiled against `model`'s vocabulary:
        `kind` "json_schema" (a JSON Schema, as JSON text), "lark" (llguidance's Lark dialect),
        "regex" or "gbnf" (llama.cpp's GBNF from rule `root`, translated to Lark: the same language,
        with llguidance's bounded work per step). Output may only end (an end-of-generation token)
        where the constraint is complete, and must end once it is. Keeps `model` alive.
        `SchemaError` when llguidance cannot compile the constraint or it admits no output;
        `SamplerInitError` for GBNF that llama.cpp would not parse either.
        """
    @staticmethod
    def grammar_lazy_patterns(
        model: LlamaModel, grammar: str, root: str, trigger_patterns: Sequence[str], trigger_tokens: _Tokens
    ) -> LlamaSampler:
        """A grammar that applies only after one of `trigger_patterns` (regexes) or
        `trigger_tokens` appears; the grammar then starts where the pattern's first matching
        group starts (or the whole match, or the trigger token), or, when it does not take that
        text, after the match (a call's grammar without the marker that triggers it). Patterns
        use the `regex`
        crate's syntax, matched byte-wise with ASCII classes like llama.cpp's `std::regex`, in
        linear time; a pattern with look-around (Functionary's `>>>(?!all)`) is matched by
        `fancy-regex` over the text's UTF-8, at most 100,000 backtracking steps a search (past
        them the request fails); back-references are refused (`ValueError`), and a trigger must
        lie within the last 16 KiB of accepted text. The GBNF grammar is compiled by
        llguidance (as `llguidance(model, "gbnf", ...)`), so its work per token is bounded.
        `SamplerInitError` for a grammar llama.cpp would not parse either; once triggered, text
        the grammar refuses is `SchemaError`.
        """
    @staticmethod
    def dry(
        model: LlamaModel,
        multiplier: float,
        base: float,
        allowed_length: int,
        penalty_last_n: int,
        seq_breakers: Sequence[str] = ...,
    ) -> LlamaSampler:
        """DRY ("don't repeat yourself") penalties; `seq_breakers` end a repeated sequence."""
    @staticmethod
    def infill(model: LlamaModel) -> LlamaSampler:
        """Fill-in-the-middle sampling for infill models."""
    @staticmethod
    def chain(samplers: Sequence[LlamaSampler], no_perf: bool = False) -> LlamaSampler:
        """Applies `samplers` in order; the last one must select a token (`greedy` or `dist`).
        The chain holds copies: the given samplers stay usable on their own.
        """
    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        """Samples a token from output row `idx` of `ctx` (negative counts from the last output)
        and returns its id; like llama.cpp's `llama_sampler_sample`, this also accepts the
        token (do not `accept` it again). `IndexError` if that row has no logits (or the context
        computes none); `ValueError` if the sampler selects no token (it must end with greedy,
        dist, mirostat, mirostat_v2 or adaptive_p) or a refused token left it unusable (call
        `reset()`); `ShimError` when no candidate is left that the sampler allows (e.g. a grammar
        after top_k), in which case nothing is accepted.
        """
    def apply(self, candidates: LlamaTokenDataArray) -> None:
        """Applies the sampler to `candidates` in place (filters, sorts, sets probabilities or
        selects a token, depending on the sampler).
        """
    def accept(self, token: int) -> None:
        """Tells the sampler that `token` was chosen (updates penalties, grammar state, ...)."""
    def reset(self) -> None:
        """Forgets what was accepted so far."""
    def name(self) -> str:
        """The sampler's name, e.g. `"greedy"` or `"chain"`."""

@final
class LlamaTokenData:
    """One candidate: token `id`, its `logit` and probability `p` (read-only)."""

    @property
    def id(self) -> int:
        """The token id."""
    @property
    def logit(self) -> float:
        """The token's logit."""
    @property
    def p(self) -> float:
        """The token's probability (0 until a sampler computes it)."""

@final
class LlamaTokenDataArray:
    """The candidates of one output row: `len()`, iteration over `LlamaTokenData`, numpy copies
    `ids`, `logits` and `p`, and what the last sampler applied selected.
    """

    @property
    def ids(self) -> npt.NDArray[np.int32]:
        """Token ids, a new int32 array."""
    @property
    def logits(self) -> npt.NDArray[np.float32]:
        """Logits, a new float32 array."""
    @property
    def p(self) -> npt.NDArray[np.float32]:
        """Probabilities, a new float32 array (zeros until a sampler computes them)."""
    @property
    def selected(self) -> int | None:
        """Index of the candidate the last sampler selected, or None."""
    @property
    def sorted(self) -> bool:
        """Whether the candidates are sorted by logit, highest first."""
    def selected_token(self) -> int | None:
        """The token the last sampler selected, or None."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> LlamaTokenData: ...

@final
class LlamaLoraAdapter:
    """A LoRA adapter for one model; set it on a context with `LlamaContext.lora_adapter_set`."""

    @property
    def path(self) -> Path:
        """Path of the GGUF file it was loaded from."""
    @property
    def in_use(self) -> bool:
        """Whether a context has this adapter set now."""
    def close(self) -> None:
        """Frees the adapter now. `ValueError` while a context has it set."""
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    def __enter__(self) -> LlamaLoraAdapter: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

@final
class MtmdContext:
    """A multimodal projector (an mmproj GGUF) loaded for one text model: the vision or audio
    encoder whose outputs the model reads as embeddings.
    """

    def __new__(
        cls,
        model: LlamaModel,
        mmproj_path: _Path,
        *,
        use_gpu: bool = True,
        n_threads: int | None = None,
        image_min_tokens: int | None = None,
        image_max_tokens: int | None = None,
        media_marker: str | None = None,
        warmup: bool = False,
    ) -> MtmdContext: ...
    @staticmethod
    def default_marker() -> str:
        """The marker `tokenize` replaces with a bitmap unless `media_marker` was given: `<__media__>`."""
    @property
    def model(self) -> LlamaModel:
        """The `LlamaModel` this projector was loaded for."""
    def marker(self) -> str:
        """The marker `tokenize` replaces with a bitmap."""
    def supports_vision(self) -> bool:
        """Whether the projector reads images."""
    def supports_audio(self) -> bool:
        """Whether the projector reads audio."""
    def audio_sample_rate(self) -> int:
        """The sample rate audio must have (Hz); -1 without audio support."""
    def decode_use_mrope(self) -> bool:
        """Whether the model places media with several positions per embedding (M-RoPE): the
        chunks' `n_pos` then differs from `n_tokens`.
        """
    def n_encodes(self) -> int:
        """Media chunks encoded by this projector so far. The embeddings of the last 16 media
        (up to 256 MiB) are kept by id and chunk (a long clip or a tiled image is several chunks of one
        id): evaluating the same image again does not encode it.
        """
    def tokenize(
        self, text: str, bitmaps: Sequence[MtmdBitmap] = ..., *, add_special: bool = True, parse_special: bool = True
    ) -> MtmdInputChunks:
        """Tokenizes `text`, in which each `marker()` stands for the next of `bitmaps`
        (special tokens parsed when `parse_special`). `MtmdError` kind `TokenizeError` when the
        markers and bitmaps do not match or the projector cannot read a bitmap's kind of media.
        """
    def tokenize_from_parts(
        self, parts: Sequence[str | MtmdBitmap], *, add_special: bool = True, parse_special: bool = False
    ) -> MtmdInputChunks:
        """Tokenizes `parts` (strings and `MtmdBitmap`s) in order, without markers: a marker in
        the text is text. Special tokens are parsed in the strings when `parse_special`.
        """
    def eval_chunks(
        self, ctx: LlamaContext, chunks: MtmdInputChunks, n_past: int, seq_id: int = 0, *, logits_last: bool = True
    ) -> int:
        """Evaluates `chunks` into sequence `seq_id` of `ctx` from position `n_past`, which must be
        where the sequence ends: text in decodes of `n_batch` tokens, each image or audio clip
        encoded by the projector, then decoded as embeddings. With `logits_last`, the last
        token has logits (output row -1) when the prompt ends with text. Returns the position
        after the chunks. All or nothing, like `decode`: on any failure the sequence is cut back
        to `n_past` and the error raised (`ValueError` for chunks of another projector or a
        context of another model, `MtmdError` when encoding fails, `DecodeError`...).
        """
    def close(self) -> None:
        """Frees the projector now; later calls raise `ValueError`."""
    def __enter__(self) -> MtmdContext: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

@final
class MtmdBitmap:
    """An image or an audio clip, ready for `MtmdContext.tokenize`."""

    @classmethod
    def from_rgb(cls, image: npt.NDArray[np.uint8]) -> MtmdBitmap:
        """An image from an `(height, width, 3)` uint8 array of RGB pixels (copied)."""
    @classmethod
    def from_buf(cls, data: bytes, *, max_pixels: int = ..., sample_rate: int = ...) -> MtmdBitmap:
        """An image decoded from the bytes of a PNG, JPEG, GIF or BMP file, or an audio clip from
        a WAV file, by Rust decoders (not llama.cpp's). `ImageError` for an image refused: not
        one of the formats, an animation, a truncated or malformed file, or more than
        `max_pixels` pixels (checked in the header, before decoding); `ValueError` for
        `max_pixels` above 2**27. A WAV file is mixed down to mono and resampled to
        `sample_rate` (the projector's `audio_sample_rate()`); `AudioError` for one refused.
        """
    @classmethod
    def from_file(cls, path: _Path, *, max_pixels: int = ..., sample_rate: int = ...) -> MtmdBitmap:
        """An image or audio clip read from a file, as `from_buf`."""
    @classmethod
    def from_audio(cls, samples: npt.NDArray[np.float32]) -> MtmdBitmap:
        """An audio clip from mono float32 samples at the projector's `audio_sample_rate()`
        (copied); from 0.1 s to ten minutes at 16 kHz, every sample finite.
        """
    def nx(self) -> int:
        """Width in pixels (for audio, the number of samples)."""
    def ny(self) -> int:
        """Height in pixels (1 for audio)."""
    def n_bytes(self) -> int:
        """Size of the pixel or sample data in bytes."""
    def is_audio(self) -> bool:
        """Whether this is an audio clip."""
    def data(self) -> npt.NDArray[np.uint8] | npt.NDArray[np.float32]:
        """A copy of the content: an `(ny, nx, 3)` uint8 array for an image, float32 samples for
        audio.
        """
    def id(self) -> str | None:
        """The bitmap's name in the chunks it becomes: the SHA-256 of its content unless `set_id`
        changed it.
        """
    def set_id(self, id: str) -> None:
        """Names the bitmap (chunks tokenized from it afterwards carry `id`)."""

@final
class MtmdInputChunks:
    """A prompt tokenized with its media by `MtmdContext.tokenize`; a sequence of `MtmdInputChunk`."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> MtmdInputChunk: ...
    def n_tokens(self) -> int:
        """Tokens of all chunks (an image counts its embeddings)."""
    def n_pos(self) -> int:
        """Positions all chunks take in the KV cache (may differ from `n_tokens` for M-RoPE models)."""

@final
class MtmdInputChunk:
    """One chunk of an `MtmdInputChunks`: text tokens, or an image or audio clip's embeddings."""

    def chunk_type(self) -> MtmdInputChunkType:
        """What the chunk holds, as an `MtmdInputChunkType`."""
    def n_tokens(self) -> int:
        """Its tokens (an image's or audio clip's embeddings count as tokens)."""
    def n_pos(self) -> int:
        """The KV positions it takes."""
    def text_tokens(self) -> list[int] | None:
        """A text chunk's token ids; None for media."""
    def id(self) -> str | None:
        """A media chunk's id (its bitmap's, see `MtmdBitmap.id`); None for text."""

@final
class ThreadPool:
    """A pool of `n_threads` ggml compute threads, for `LlamaContext.attach_threadpool`.

    Contexts without one share a pool per thread count; a pool of your own gives a context
    its own threads or other settings (priority, polling, CPU pinning). It can be attached to
    one context at a time (ggml pools are not reentrant); the context keeps it alive while
    attached, and `close()` refuses while it is. A pool started before `os.fork()` has no
    threads in the child: the child refuses to use it (`ValueError`).
    """

    def __new__(
        cls, n_threads: int, *, prio: int = 0, poll: int = 50, strict_cpu: bool = False, paused: bool = False
    ) -> ThreadPool: ...
    @property
    def n_threads(self) -> int:
        """Number of threads in the pool."""
    @property
    def attached(self) -> bool:
        """Whether the pool is attached to a context now."""
    def close(self) -> None:
        """Stops the threads now. `ValueError` while attached to a context."""
    def __enter__(self) -> ThreadPool: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

@final
class PerfContextData:
    """Timings (milliseconds) and token counts of a context, read-only. The counters stay at
    zero unless the context was made with `no_perf=False`.
    """

    @property
    def t_start_ms(self) -> float:
        """When the context started, in ms since an arbitrary epoch."""
    @property
    def t_load_ms(self) -> float:
        """Time spent loading, in ms."""
    @property
    def t_p_eval_ms(self) -> float:
        """Time spent on prompt (batch) evaluation, in ms."""
    @property
    def t_eval_ms(self) -> float:
        """Time spent on single-token evaluation, in ms."""
    @property
    def n_p_eval(self) -> int:
        """Prompt tokens evaluated."""
    @property
    def n_eval(self) -> int:
        """Single tokens evaluated."""
    @property
    def n_reused(self) -> int:
        """Decodes that reused the previous compute graph instead of building one."""

@final
class SamplingParams:
    """How a request samples: `temperature` 0 is greedy (penalties and `logit_bias` still apply); otherwise the
    candidates pass `top_k` (0: all), `typical_p`, `top_p` and `min_p` (1, 1 and 0 switch them off), are
    scaled by the temperature and drawn with `seed` (None: random). Penalties look at the last
    `penalty_last_n` tokens (1 and 0 switch them off). `logit_bias` maps token ids to values added to their
    logits (`-inf` bans a token). The defaults are llama.cpp's (`common/common.h`).
    """

    def __new__(
        cls,
        *,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        penalty_last_n: int = 64,
        logit_bias: Mapping[int, float] | None = None,
        seed: int | None = None,
    ) -> SamplingParams: ...
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]:
        """"""
    def sampler(self, model: LlamaModel) -> LlamaSampler:
        """These parameters as a `LlamaSampler` chain for `model`, for `generate` and friends (each
        call builds a fresh chain: samplers keep state). `ValueError` for a logit bias on a token
        the model does not have.
        """
    @property
    def temperature(self) -> float:
        """Scales the logits; 0 picks the most likely token (greedy)."""
    @property
    def top_k(self) -> int:
        """Keeps the `top_k` most likely tokens (0 keeps all)."""
    @property
    def top_p(self) -> float:
        """Keeps the most likely tokens whose probabilities add up to `top_p` (1: all)."""
    @property
    def min_p(self) -> float:
        """Drops tokens less likely than `min_p` times the most likely one (0: none)."""
    @property
    def typical_p(self) -> float:
        """Locally typical sampling mass (1: off)."""
    @property
    def repeat_penalty(self) -> float:
        """Divides the logits of tokens seen in the window (1: off)."""
    @property
    def frequency_penalty(self) -> float:
        """Subtracted per occurrence in the window (0: off)."""
    @property
    def presence_penalty(self) -> float:
        """Subtracted once for tokens present in the window (0: off)."""
    @property
    def penalty_last_n(self) -> int:
        """The window of last tokens the penalties look at (0: off)."""
    @property
    def logit_bias(self) -> dict[int, float]:
        """Token id to a value added to its logit."""
    @property
    def seed(self) -> int | None:
        """The random generator's seed; None draws one."""

@final
class EngineStats:
    """An engine's counts at one moment (`Engine.stats()`): requests running and waiting, KV cells used by
    running requests, kept for prefix reuse and in total, the sequences, prefix-cache hits, tokens generated
    and prompt tokens computed, speculative tokens drafted and accepted, and generated tokens per second of
    engine work.
    """

    @property
    def running(self) -> int:
        """Requests generating now."""
    @property
    def waiting(self) -> int:
        """Requests waiting for a sequence."""
    @property
    def kv_cells_used(self) -> int:
        """KV cells the running requests hold."""
    @property
    def kv_cells_cached(self) -> int:
        """KV cells kept for prefix reuse (no request holds them)."""
    @property
    def kv_cells_total(self) -> int:
        """The context's KV cells (`n_ctx`)."""
    @property
    def n_seq_max(self) -> int:
        """Sequences: requests that can run at once."""
    @property
    def prefix_cache_hits(self) -> int:
        """Requests that reused cached prompt tokens."""
    @property
    def tokens_generated(self) -> int:
        """Tokens generated."""
    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens decoded (not reused)."""
    @property
    def drafted_tokens(self) -> int:
        """Tokens proposed by speculative drafts and verified."""
    @property
    def accepted_tokens(self) -> int:
        """Drafted tokens the model accepted."""
    @property
    def tokens_per_second(self) -> float:
        """Tokens generated per second of engine work (0 before any)."""

@final
class Completion:
    """A finished request: its text and tokens, why it ended, what it cost."""

    @property
    def text(self) -> str:
        """The generated text (stop strings excluded)."""
    @property
    def tokens(self) -> list[int]:
        """The generated token ids (an end-of-generation token excluded)."""
    @property
    def logprobs(self) -> list[list[tuple[int, float]]]:
        """Per generated token when `logprobs` was asked for: `(token, log-probability)` of that
        token, then of the most likely others, under the model's own distribution.
        """
    @property
    def finish_reason(self) -> str:
        """ "stop" (end of generation or a stop string), "length" (`max_tokens` or the context
        size), "cancelled".
        """
    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt."""
    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV was reused instead of computed."""
    @property
    def completion_tokens(self) -> int:
        """Tokens sampled (an end-of-generation token included)."""
    @property
    def drafted_tokens(self) -> int:
        """Tokens proposed by speculative drafts and verified (0 without speculation)."""
    @property
    def accepted_tokens(self) -> int:
        """Drafted tokens that were what the model sampled: each saved a decode."""
    @property
    def queue_seconds(self) -> float:
        """Seconds from `submit` until the engine took the request."""
    @property
    def first_token_seconds(self) -> float | None:
        """Seconds from `submit` until the first token was sampled (None if none was)."""
    @property
    def tokens_per_second(self) -> float:
        """Sampled tokens per second, from the first token to the last."""

@final
class _Regex:
    """A pattern compiled by the `regex` crate: ECMA-262's syntax less look-around and
    back-references (which llguidance refuses too).
    """

    def __new__(cls, pattern: str) -> _Regex:
        """`ValueError` for a pattern the `regex` crate cannot compile within its size limit."""
    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in `text` (JSON Schema's `pattern` is unanchored)."""

@final
class _ContextLoop:
    """The engine's scheduler on sequences `seqs` of a caller's context (generation on a caller's
    context: `continue_sequence` and `generate_batch` hold one each).
    """

    def __new__(
        cls,
        ctx: LlamaContext,
        seqs: Sequence[int],
        speculative: NgramDraft | DraftModel | None = None,
        prefix_cache: bool = False,
        mtmd: MtmdContext | None = None,
    ) -> _ContextLoop:
        """Serves sequences `seqs` of `ctx` (the others stay the caller's), drafting as
        `speculative` asks (an `NgramDraft` or a `DraftModel`, whose context takes `ctx`'s sizes
        and threads); with `prefix_cache`, a request reuses the cells a finished one (or `adopt`)
        left in a sequence, as the engine's do."""
    def adopt(self, tokens: Sequence[int], seq: int) -> None:
        """Tells the prefix cache that free sequence `seq` holds `tokens` from position 0 (the
        caller read them there): `ValueError` for a sequence the loop does not serve, or one in
        use, or a loop without a prefix cache.
        """
    def submit(
        self,
        tokens: Sequence[int],
        max_tokens: int,
        stop: Sequence[str],
        sampler: LlamaSampler,
        held_seq: int | None = None,
        holds: Sequence[int] | None = None,
        media: Sequence[tuple[int, MtmdInputChunks]] = ...,
    ) -> _RequestCore:
        """Queues a request for `tokens`, with each of `media` (`(at, chunks)` of the loop's
        projector) spliced in before text token `at`, choosing its tokens with a copy of
        `sampler`'s state. With `held_seq`, the request runs on that sequence: when it ends,
        `sampler` takes the copy's state and `held()` what the sequence holds. The sequence holds
        `holds` (what `held()` said after an earlier request: the prompt reads only what follows
        the start they share), or, when `holds` is None, all of `tokens`, the last with logits
        in the context's last decode: the request then samples from there and must be the only
        one of the loop.
        """
    def step(self) -> bool:
        """Runs one step (without the GIL); whether requests are left."""
    def held(self) -> list[int]:
        """What the last held request left in its sequence's KV cache, from position 0: its
        prompt (each image's positions as placeholder tokens, negative) and the tokens it
        generated (taken: a second call returns none).
        """

@final
class _Waker:
    """The pipe an asyncio loop watches for news of the requests it awaits (one per loop)."""

    def fileno(self) -> int:
        """The descriptor to watch for reading."""
    def drain(self) -> None:
        """Empties the pipe (after it woke the loop)."""

@final
class _RequestCore:
    """The Python handle of one request (wrapped by `llamactx.Request`)."""

    def next_piece(self) -> tuple[str, list[list[tuple[int, float]]]] | None:
        """The next piece, `(text, logprobs of its tokens)`; None once the request is over (its
        failure is raised then). Blocks with the GIL released.
        """
    def poll(self) -> tuple[str, tuple[str, list[list[tuple[int, float]]]] | None]:
        """`("piece", (text, logprobs))`, `("end", None)` or `("wait", None)`, without blocking."""
    def result(self, timeout: float | None = None) -> Completion:
        """The `Completion`, waiting up to `timeout` seconds (None: no limit) with the GIL
        released; the failure is raised if the request failed, `TimeoutError` after `timeout`.
        """
    def result_now(self) -> Completion | None:
        """The `Completion` if the request is over (raising its failure), else None."""
    def ready(self, end_only: bool) -> bool:
        """Whether the awaited news is there: a piece or the end (`end_only`: the end)."""
    def cancel(self) -> None:
        """Asks the engine to stop the request at its next step."""
    @property
    def done(self) -> bool:
        """Whether the request is over."""
    def watch(self, waker: _Waker, pieces: bool) -> None:
        """Wakes `waker`'s loop at the end, and on every piece from now on if `pieces`; every
        loop that watches is woken.
        """

@final
class _EngineCore:
    """The native engine behind `llamactx.Engine`."""

    def __new__(
        cls,
        model: LlamaModel,
        max_waiting: int,
        prefix_cache: bool,
        *,
        speculative: NgramDraft | DraftModel | None = None,
        mtmd: MtmdContext | None = None,
        lora: tuple[LlamaLoraAdapter, float] | None = None,
        **options: Any,
    ) -> _EngineCore: ...
    def submit(
        self,
        tokens: Sequence[int],
        max_tokens: int,
        stop: Sequence[str],
        sampling: SamplingParams | None,
        logprobs: int,
        constraint: tuple[str, str] | LlamaSampler | None,
        media: Sequence[tuple[int, MtmdInputChunks]] = ...,
        lora_scale: float | None = None,
    ) -> _RequestCore:
        """Queues a request for `tokens`, with each of `media` (`(at, chunks)`: an image's chunks
        from the engine's projector, to go before text token `at`) spliced in, generated with the
        engine's LoRA adapter at `lora_scale` (None: the engine's scale). `ValueError` for a
        prompt that can never run or a scale without an adapter, `EngineBusy` when `max_waiting`
        requests already wait.
        """
    def stats(self) -> EngineStats:
        """The engine's counts now (`EngineStats`)."""
    def save_slots(self, seq: int | None = None) -> list[bytes]:
        """Slot `seq`'s cached tokens and cells as llama.cpp's sequence state file (what
        llama-server's `/slots/{id}?action=save` writes), once no request holds it; with
        `seq=None`, the file of every free slot that holds cached tokens.
        """
    def restore_slot(self, file: bytes, seq: int | None = None) -> tuple[int, int]:
        """Restores a sequence state file into slot `seq` (once no request holds it), or into the
        free slot whose cache is worth least (`seq=None`), for the prefix cache to reuse; returns
        the slot and the number of tokens it holds. `StateError` for a file this context refuses
        (the slot is then empty), `ValueError` on an engine without a prefix cache.
        """
    def slots(self) -> list[tuple[int, bool, int]]:
        """Every slot as `(slot, busy, tokens)`: whether a request holds it, and the tokens its
        cells hold (a request's so far, or those cached for reuse), between two steps.
        """
    def erase_slot(self, seq: int) -> int:
        """Empties slot `seq` (once no request holds it); returns the number of tokens it held."""
    def close(self) -> None:
        """Stops the engine: requests still waiting or running end as "cancelled"; returns once
        the engine thread has ended (after the step it is computing).
        """
    @property
    def n_ctx_seq(self) -> int:
        """KV cells of one sequence (`n_ctx / n_seq_max`): a prompt must be shorter."""
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    @property
    def lora_scale(self) -> float | None:
        """The scale of the engine's LoRA adapter for requests that name none (None without an
        adapter).
        """
    def set_lora_scale(self, scale: float) -> None:
        """Sets the scale of the engine's LoRA adapter for the requests submitted from now on that
        name none (llama-server's `POST /lora-adapters`). `ValueError` without an adapter, or for
        a scale that is not finite.
        """

def _check_constraint_size(kind: str, data: str) -> None:
    """Python's check of a JSON Schema (`OutputCheck`) refuses here, before its own far costlier
    work, a constraint too large to compile (`guidance::check_size`: `SchemaError` kind
    `TooLarge`).
    """

def _check_media_ending(tokens_after_last_medium: int) -> None:
    """Python's `MediaPrompt` checks its text after the last medium here (`ends_with_text`)."""

def _check_speculative(speculative: object) -> None:
    """Checks `NgramDraft`'s and `DraftModel`'s values when they are made."""

def _vocabulary_ids(model: LlamaModel, tokens: _Tokens) -> list[int]:
    """`tokens` (any sequence of ints, or a 1-D integer array) as ids of `model`'s vocabulary: the
    one check every path makes, for Python's (`embed`'s ids). `ValueError` for one outside it.
    """

def _rerank_prompt(model: LlamaModel, query: str, document: str) -> list[int]:
    """The tokens of a reranker's prompt for `query` and `document` (see the module's docs)."""

def _gpu_devices() -> int:
    """How many GPUs (discrete or integrated) the build's backends found: 0 on a CPU build, where
    `n_gpu_layers` and `main_gpu` change nothing. RPC servers are not counted.
    """

def _check_template_variables(kwargs: str) -> None:
    """The check `apply` makes of `kwargs` (JSON text), alone: the renderer makes it first, so that
    what it refuses is known to be the template variables' fault. `ValueError` as `apply`'s.
    """

def _check_reasoning(format: str, budget: int | None) -> None:
    """The checks of `llamactx.Reasoning`'s `format` and `budget`, which `apply` and
    `reasoning_budget` make again: `ValueError` for an unknown format or a budget below 0.
    """

def _check_prompt(
    cells: int, n_ctx_seq: int, *, max_tokens: int = 0, images: bool = False, drafts: bool = False
) -> int:
    """Python's one-sequence paths check a request here: `ValueError` for a prompt of `cells`
    that a sequence of `n_ctx_seq` cells can never generate after (`prompt`), or a negative
    `max_tokens`; returns `max_tokens` as a count.
    """

def cpu_features() -> list[str]:
    """The features the builds of the x86-64 wheel differ in that this CPU and its OS support,
    named as Rust's `is_x86_feature_detected!` names them.
    """

def serve_rpc(
    host: str = "127.0.0.1",
    port: int = 50052,
    *,
    threads: int | None = None,
    cache_dir: _Path | None = None,
    on_ready: Callable[[], object] | None = None,
) -> None:
    """Runs llama.cpp's RPC server for this machine's devices on `host:port` and blocks until
    Ctrl-C (`KeyboardInterrupt`), which ends the call; the server itself stops with the
    process, which should then end with `os._exit` (as `llamactx rpc-server` does): the C++
    destructors of a normal exit race the serving thread, which cannot be stopped. `threads`
    (default: every CPU this process may use) compute for its clients; `cache_dir` keeps tensors
    clients upload, so that a model's weights cross the network once. `on_ready` is called once
    the server accepts connections. The protocol has no authentication: listen only on loopback
    or a trusted network. `RpcError` when the address cannot be listened on.
    """

@final
class _ChatTemplates:
    """A model's chat templates, parsed once (internal: the renderer of every chat, see
    `llamactx._render`).
    """

    def __new__(cls, model: LlamaModel, template: str | None = None) -> _ChatTemplates: ...
    @property
    def supports_tool_calls(self) -> bool:
        """Whether the template renders tools and tool calls (llama.cpp's capability analysis)."""
    @property
    def supports_thinking(self) -> bool:
        """Whether the template thinks when told to (llama.cpp's analysis): a chat's
        `enable_thinking` defaults to it, as in llama-server.
        """
    def apply(
        self,
        messages: str,
        tools: str,
        tool_choice: str,
        parallel_tool_calls: bool,
        template_kwargs: str | None = None,
        reasoning_format: str = "auto",
    ) -> _ChatApplied:
        """Renders `messages` (OpenAI's, as JSON) with `tools` (JSON) for the assistant's reply;
        `tool_choice` is "auto", "required" or "none"; `template_kwargs` (a JSON object) are
        further variables of the template, llama-server's `chat_template_kwargs` (its
        `enable_thinking` also tells llama.cpp whether the reply thinks; without it, the reply
        thinks where the template can, `supports_thinking`); `reasoning_format` is
        one of llama-server's `--reasoning-format` choices (`_REASONING_FORMATS`): how the parser
        hands back the reply's reasoning. `ValueError` for what the template cannot render or an
        unknown format; `ChatTemplateError` kind `WorkLimit` when rendering passes the work limit.
        """

@final
class _ChatApplied:
    """A rendered chat: its prompt tokens, the constraint of its reply, and the reply's parser."""

    def tokens(self) -> list[int]:
        """The prompt's tokens: special tokens parsed in what the template wrote, never in what
        the messages hold (a user cannot forge a turn).
        """
    def segments(self, marker: str | None = None) -> list[list[int]]:
        """The prompt's tokens (as `tokens`) in runs split where `marker` stands in the messages'
        text: one run more than markers. The renderer puts a marker no message can contain
        where each image goes.
        """
    def sampler(self) -> LlamaSampler | None:
        """The grammar sampler the reply needs (None: free text): lazy, waiting for its
        triggers, or eager and past the generation prompt the template already wrote. The GBNF
        llama.cpp writes from the tools' schemas is compiled by llguidance, whose work per token
        is bounded, whatever the schemas.
        """
    def additional_stops(self) -> list[str]:
        """Extra stop strings the format needs."""
    @property
    def reasons(self) -> bool:
        """Whether the template's replies open a reasoning block llama.cpp knows the tags of (the
        parser then splits it out, and `reasoning_budget` can bound it).
        """
    def reasoning_budget(self, budget: int, message: str = "") -> LlamaSampler | None:
        """llama.cpp's reasoning-budget sampler stage for this reply (None where the template does
        not reason): after `budget` tokens of reasoning it forces `message` and the block's
        closing tag, token by token. A block the template's generation prompt opens counts from
        the reply's first token. `ValueError` for a budget below 0.
        """
    def parse(self, text: str, partial: bool = False) -> str:
        """OpenAI's assistant message (JSON text: `content`, `tool_calls` without ids,
        `reasoning_content`) for the generated `text`; `partial` for a reply still being
        generated (a tag cut short is held back, not shown). `ValueError` when it does not
        follow the format.
        """
