"""Tiny GGUF files written with the ``gguf`` package: a random BERT encoder (for ``encode``), a
random GPT-2 with another model's vocabulary (learned positions, for a draft model),
a random T5 encoder-decoder, a random recurrent Mamba (for sequence-state restores), a random
hybrid Nemotron-H (KV cache plus recurrent state), a random LoRA adapter for SmolLM2 (for
``lora_adapter_*``) and vocabulary-only models."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

BERT_WIDTH = 32
BERT_LAYERS = 2
BERT_CONTEXT = 128
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "in", "park", "sun", "is", "hot", "cold", "day", "night"]
WORD_START = "\u2581"  # llama.cpp's WPM vocabulary marks word-initial pieces with it


def random_tensors(writer: gguf.GGUFWriter, seed: int) -> Callable[..., None]:
    """``tensor(name, *shape, scale=0.1)``: adds a float32 tensor of ``shape`` drawn from a normal
    distribution scaled by ``scale`` (the same values for the same seed and order of calls)."""
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, scale: float = 0.1) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    return tensor


def add_feed_forward(tensor: Callable[..., None], prefix: str, width: int, hidden: int) -> None:
    """A feed-forward of ``hidden`` with biases, ``{prefix}.ffn_up`` and ``{prefix}.ffn_down``;
    ``tensor`` is ``random_tensors``' writer."""
    tensor(f"{prefix}.ffn_up.weight", hidden, width)
    tensor(f"{prefix}.ffn_up.bias", hidden)
    tensor(f"{prefix}.ffn_down.weight", width, hidden)
    tensor(f"{prefix}.ffn_down.bias", width)


def bert_vocabulary() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [WORD_START + w for w in WORDS + letters] + letters + [".", ",", "!", "?"]
    # llama.cpp aborts on a vocabulary with duplicates, so keep the first of each.
    return SPECIALS + list(dict.fromkeys(pieces))


def write_tiny_bert(path: Path, seed: int = 0, duplicate_token: bool = False) -> Path:
    """A 2-layer, 32-wide BERT with random weights, MEAN pooling and a WordPiece vocabulary
    (with ``duplicate_token``, one that lists a token twice: llama.cpp aborts on those)."""
    vocab = bert_vocabulary()
    if duplicate_token:
        vocab[-1] = vocab[-2]
    writer = gguf.GGUFWriter(str(path), "bert")
    tensor = random_tensors(writer, seed)
    writer.add_name("tiny-bert")
    writer.add_context_length(BERT_CONTEXT)
    writer.add_embedding_length(BERT_WIDTH)
    writer.add_feed_forward_length(2 * BERT_WIDTH)
    writer.add_block_count(BERT_LAYERS)
    writer.add_head_count(2)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_token_type_count(2)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(vocab)
    control = gguf.TokenType.CONTROL
    writer.add_token_types([control if t in SPECIALS else gguf.TokenType.NORMAL for t in vocab])
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(1)
    writer.add_bos_token_id(2)  # BERT's [CLS] is llama.cpp's BOS
    writer.add_sep_token_id(3)
    writer.add_mask_token_id(4)

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(BERT_WIDTH, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(BERT_WIDTH, dtype=np.float32))

    width = BERT_WIDTH
    tensor("token_embd.weight", len(vocab), width, scale=1.0)
    tensor("token_types.weight", 2, width)
    tensor("position_embd.weight", BERT_CONTEXT, width)
    norm("token_embd_norm")
    for block in range(BERT_LAYERS):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{block}.{part}.weight", width, width)
            tensor(f"blk.{block}.{part}.bias", width)
        norm(f"blk.{block}.attn_output_norm")
        add_feed_forward(tensor, f"blk.{block}", width, 2 * width)
        norm(f"blk.{block}.layer_output_norm")
    _finish(writer)
    return path


T5_WIDTH = 32
T5_HEADS = 2
T5_ENCODER_LAYERS = 2
T5_DECODER_LAYERS = 1
T5_CONTEXT = 128
T5_BUCKETS = 32
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]  # llama.cpp's defaults for a "t5" vocabulary: pad 0, EOS 1, UNK 2


def t5_vocabulary() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    return T5_SPECIALS + [WORD_START + w for w in WORDS] + letters


def write_tiny_t5(path: Path, seed: int = 0) -> Path:
    """A T5 encoder-decoder with random weights: 32 wide, 2 heads, 2 encoder layers and 1 decoder
    layer (ReLU feed-forward, relative position buckets in each stack's first layer, separate
    ``output``) and a unigram ("t5") vocabulary whose decoder start token is ``<pad>`` (id 0)."""
    vocab = t5_vocabulary()
    writer = gguf.GGUFWriter(str(path), "t5")
    tensor = random_tensors(writer, seed)
    writer.add_name("tiny-t5")
    writer.add_context_length(T5_CONTEXT)
    writer.add_embedding_length(T5_WIDTH)
    writer.add_feed_forward_length(2 * T5_WIDTH)
    writer.add_block_count(T5_ENCODER_LAYERS)
    writer.add_decoder_block_count(T5_DECODER_LAYERS)
    writer.add_head_count(T5_HEADS)
    writer.add_key_length(T5_WIDTH // T5_HEADS)
    writer.add_value_length(T5_WIDTH // T5_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_relative_attn_buckets_count(T5_BUCKETS)
    writer.add_decoder_start_token_id(0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("t5")
    writer.add_add_space_prefix(True)  # as converted T5 files: "the" is read as "\u2581the"
    writer.add_remove_extra_whitespaces(True)
    writer.add_token_list(vocab)
    pieces = len(vocab) - len(T5_SPECIALS)
    writer.add_token_scores([0.0] * len(T5_SPECIALS) + [-float(i) for i in range(1, pieces + 1)])
    specials = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN]
    writer.add_token_types(specials + [gguf.TokenType.NORMAL] * pieces)
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(2)

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(T5_WIDTH, dtype=np.float32))

    width, ff = T5_WIDTH, 2 * T5_WIDTH
    tensor("token_embd.weight", len(vocab), width, scale=1.0)
    tensor("output.weight", len(vocab), width)
    norm("enc.output_norm")
    norm("dec.output_norm")
    # numpy shapes are ggml's reversed: attn_q is [n_in, n_out] in ggml, attn_rel_b [n_head, buckets].
    stacks = {"enc": (T5_ENCODER_LAYERS, ("attn",)), "dec": (T5_DECODER_LAYERS, ("attn", "cross_attn"))}
    for stack, (layers, attentions) in stacks.items():
        tensor(f"{stack}.blk.0.attn_rel_b.weight", T5_BUCKETS, T5_HEADS)  # later layers share it
        for block in range(layers):
            for attention in attentions:
                norm(f"{stack}.blk.{block}.{attention}_norm")
                for part in ("q", "k", "v", "o"):
                    tensor(f"{stack}.blk.{block}.{attention}_{part}.weight", width, width)
            norm(f"{stack}.blk.{block}.ffn_norm")
            tensor(f"{stack}.blk.{block}.ffn_up.weight", ff, width)
            tensor(f"{stack}.blk.{block}.ffn_down.weight", width, ff)
    _finish(writer)
    return path


MAMBA_WIDTH = 16
MAMBA_LAYERS = 2
MAMBA_CONTEXT = 128
MAMBA_CONV = 4  # ssm.conv_kernel: each sequence's conv state keeps the last 3 columns
MAMBA_STATE = 8  # ssm.state_size
MAMBA_DT_RANK = 2  # ssm.time_step_rank


def write_tiny_mamba(path: Path, seed: int = 0) -> Path:
    """A recurrent Mamba (llama.cpp arch ``mamba``) with random weights: 16 wide, 2 layers, inner
    size 32 (llama.cpp supports only an expansion factor of 2), conv kernel 4, state size 8,
    time-step rank 2, a separate ``output`` and the SentencePiece vocabulary of
    ``spm_vocabulary()`` (unknown 0, BOS 1, EOS 2). llama.cpp gives it a recurrent memory (one
    cell per sequence) instead of a KV cache."""
    vocab = spm_vocabulary()
    width, inner, state, rank = MAMBA_WIDTH, 2 * MAMBA_WIDTH, MAMBA_STATE, MAMBA_DT_RANK
    writer = gguf.GGUFWriter(str(path), "mamba")
    tensor = random_tensors(writer, seed)
    writer.add_name("tiny-mamba")
    writer.add_context_length(MAMBA_CONTEXT)
    writer.add_embedding_length(width)
    writer.add_block_count(MAMBA_LAYERS)
    writer.add_head_count(0)  # as converted Mamba files: no attention
    writer.add_ssm_conv_kernel(MAMBA_CONV)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(state)
    writer.add_ssm_time_step_rank(rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_vocabulary(writer, vocab)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(width, dtype=np.float32))

    # numpy shapes are ggml's reversed: ssm_in is [n_embd, 2*d_inner] in ggml, ssm_a [d_state, d_inner].
    tensor("token_embd.weight", len(vocab), width, scale=1.0)
    tensor("output.weight", len(vocab), width)
    norm("output_norm.weight")
    for block in range(MAMBA_LAYERS):
        norm(f"blk.{block}.attn_norm.weight")
        tensor(f"blk.{block}.ssm_in.weight", 2 * inner, width)
        tensor(f"blk.{block}.ssm_conv1d.weight", inner, MAMBA_CONV)
        tensor(f"blk.{block}.ssm_conv1d.bias", inner)
        tensor(f"blk.{block}.ssm_x.weight", rank + 2 * state, inner)
        tensor(f"blk.{block}.ssm_dt.weight", inner, rank)
        tensor(f"blk.{block}.ssm_dt.bias", inner)
        # A = -exp(A_log) with A_log = log(1..d_state), as the converter stores it: decaying states.
        a = -np.tile(np.arange(1, state + 1, dtype=np.float32), (inner, 1))
        writer.add_tensor(f"blk.{block}.ssm_a", a)  # no ".weight" suffix on ssm_a and ssm_d
        writer.add_tensor(f"blk.{block}.ssm_d", np.ones(inner, dtype=np.float32))
        tensor(f"blk.{block}.ssm_out.weight", width, inner)
    _finish(writer)
    return path


HYBRID_WIDTH = 16
HYBRID_CONTEXT = 128
HYBRID_HEADS = 2  # attention heads of 8; the attention layer keeps both as KV heads
HYBRID_LAYERS = ("mamba2", "attention")  # layer 0 recurrent, layer 1 attention
HYBRID_INNER = 32  # ssm.inner_size: 4 Mamba-2 heads of 8
HYBRID_SSM_HEADS = 4  # ssm.time_step_rank: Mamba-2's head count
HYBRID_CONV = 4  # ssm.conv_kernel
HYBRID_STATE = 8  # ssm.state_size
HYBRID_GROUPS = 1  # ssm.group_count


def write_tiny_hybrid(path: Path, seed: int = 0) -> Path:
    """A hybrid Nemotron-H (llama.cpp arch ``nemotron_h``) with random weights, the hybrid with
    the fewest tensors: 16 wide, layer 0 a Mamba-2 mixer (inner size 32 in 4 heads, conv kernel 4,
    state size 8, 1 group) and layer 1 attention without RoPE (2 heads of 8, 2 KV heads), neither
    with a feed-forward part (``feed_forward_length`` is 0 on both, ``head_count_kv`` 0 on the
    Mamba-2 layer), tied output and the SentencePiece vocabulary of ``spm_vocabulary()``.
    llama.cpp gives it a ``llama_memory_hybrid`` memory: a KV cache for layer 1 only and a
    recurrent memory (one cell per sequence, conv and SSM states) for layer 0."""
    vocab = spm_vocabulary()
    width, inner, state, groups = HYBRID_WIDTH, HYBRID_INNER, HYBRID_STATE, HYBRID_GROUPS
    conv_channels = inner + 2 * groups * state  # x, B and C go through the convolution
    writer = gguf.GGUFWriter(str(path), "nemotron_h")
    tensor = random_tensors(writer, seed)
    writer.add_name("tiny-hybrid")
    writer.add_context_length(HYBRID_CONTEXT)
    writer.add_embedding_length(width)
    writer.add_block_count(len(HYBRID_LAYERS))
    writer.add_feed_forward_length([0] * len(HYBRID_LAYERS))  # n_ff 0: a mixer layer, not an MLP one
    writer.add_head_count(HYBRID_HEADS)
    writer.add_head_count_kv([0 if kind == "mamba2" else HYBRID_HEADS for kind in HYBRID_LAYERS])
    writer.add_ssm_conv_kernel(HYBRID_CONV)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(state)
    writer.add_ssm_time_step_rank(HYBRID_SSM_HEADS)
    writer.add_ssm_group_count(groups)
    writer.add_layer_norm_eps(1e-5)  # required; the RMS norms fall back to it
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_vocabulary(writer, vocab)

    def norm(name: str, *shape: int) -> None:
        writer.add_tensor(name, np.ones(shape or (width,), dtype=np.float32))

    # numpy shapes are ggml's reversed: ssm_in is [n_embd, d_in_proj] in ggml, ssm_a [1, n_ssm_head].
    tensor("token_embd.weight", len(vocab), width, scale=1.0)  # no "output": tied to token_embd
    norm("output_norm.weight")
    for block, kind in enumerate(HYBRID_LAYERS):
        norm(f"blk.{block}.attn_norm.weight")  # every layer's pre-norm, whatever its mixer
        if kind == "mamba2":
            # in_proj yields z, x, B, C and dt: 2*d_inner + 2*n_group*d_state + n_ssm_head rows.
            tensor(f"blk.{block}.ssm_in.weight", 2 * inner + 2 * groups * state + HYBRID_SSM_HEADS, width)
            tensor(f"blk.{block}.ssm_conv1d.weight", conv_channels, HYBRID_CONV)
            tensor(f"blk.{block}.ssm_conv1d.bias", conv_channels)
            tensor(f"blk.{block}.ssm_dt.bias", HYBRID_SSM_HEADS)
            # A = -exp(A_log) per head, as the converter stores it: decaying states.
            a = -np.arange(1, HYBRID_SSM_HEADS + 1, dtype=np.float32).reshape(HYBRID_SSM_HEADS, 1)
            writer.add_tensor(f"blk.{block}.ssm_a", a)  # no ".weight" suffix on ssm_a and ssm_d
            writer.add_tensor(f"blk.{block}.ssm_d", np.ones((HYBRID_SSM_HEADS, 1), dtype=np.float32))
            norm(f"blk.{block}.ssm_norm.weight", groups, inner // groups)
            tensor(f"blk.{block}.ssm_out.weight", width, inner)
        else:
            for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
                tensor(f"blk.{block}.{part}.weight", width, width)
    _finish(writer)
    return path


def write_lora_for_smollm2(
    path: Path, rank: int = 8, scale: float = 0.05, seed: int = 0, dtype: type[np.generic] = np.float32
) -> Path:
    """A random LoRA on every ``attn_q`` of SmolLM2-135M (30 layers, width 576), its tensors
    stored as ``dtype``."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    width = 576
    for block in range(30):
        # numpy shapes are ggml's reversed: lora_a is [n_in, rank], lora_b [rank, n_out] in ggml.
        lora_a = (rng.standard_normal((rank, width)) * scale).astype(dtype)
        lora_b = (rng.standard_normal((width, rank)) * scale).astype(dtype)
        writer.add_tensor(f"blk.{block}.attn_q.weight.lora_a", lora_a)
        writer.add_tensor(f"blk.{block}.attn_q.weight.lora_b", lora_b)
    _finish(writer)
    return path


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_vocabulary(path: Path, tokenizer: str, tokens: list[str]) -> Path:
    """A Llama-architecture GGUF holding only hyperparameters and a vocabulary, for
    ``vocab_only=True`` loads: ``tokenizer`` is the GGUF tokenizer model (``"llama"`` for
    SentencePiece, ``"none"`` for none, which keeps only the number of ``tokens``)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(tokenizer)
    if tokenizer == "none":
        writer.add_vocab_size(len(tokens))
    else:
        writer.add_token_list(tokens)
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_token_types([token_type(token) for token in tokens])
    _finish(writer)
    return path


def add_spm_vocabulary(writer: gguf.GGUFWriter, tokens: list[str]) -> None:
    """``tokens`` as a SentencePiece vocabulary (see ``spm_vocabulary``): unknown 0, BOS 1, EOS 2."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([token_type(token) for token in tokens])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def token_type(token: str) -> gguf.TokenType:
    if token.startswith("<0x"):
        return gguf.TokenType.BYTE
    if token in ("<unk>", "<s>", "</s>"):
        return gguf.TokenType.CONTROL
    return gguf.TokenType.NORMAL


def spm_vocabulary(without_byte: int | None = None) -> list[str]:
    """A SentencePiece vocabulary: unknown/BOS/EOS, the 256 byte tokens (but ``without_byte``)
    and a few words."""
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256) if byte != without_byte]
    return ["<unk>", "<s>", "</s>", *byte_tokens, *(WORD_START + word for word in WORDS)]


def read_gguf(path: Path) -> gguf.GGUFReader:
    """The GGUF file at ``path``, parsed once per process while the file stays as it is: gguf's
    reader takes about 3 s over SmolLM2's 49,152 tokens and 48,900 merges, which the draft
    model, the reranker and the other models made from SmolLM2 each read (its fields'
    ``contents()`` are new objects on every call, so sharing it shares nothing mutable)."""
    stat = path.stat()
    return _parsed_gguf(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed_gguf(path: Path, mtime_ns: int, size: int) -> gguf.GGUFReader:
    del mtime_ns, size  # the cache's key: a file rewritten in place is parsed again
    return gguf.GGUFReader(path)


def write_first_layers(source: Path, path: Path, layers: int, rename: tuple[int, str] | None = None) -> Path:
    """The model at ``source`` cut to its first ``layers`` blocks (its embeddings, output head,
    vocabulary and other metadata kept, tensors copied as stored): a draft model of the same
    vocabulary that agrees with the whole model on some tokens, not all. ``rename=(id, text)``
    gives token ``id`` another text."""
    reader = read_gguf(source)
    architecture = str(reader.fields["general.architecture"].contents())
    keys: dict[str, KeyValue | None] = {f"{architecture}.block_count": (layers, gguf.GGUFValueType.UINT32)}
    if rename is not None:
        tokens = reader.fields[gguf.Keys.Tokenizer.LIST].contents()
        tokens[rename[0]] = rename[1]
        keys[gguf.Keys.Tokenizer.LIST] = (tokens, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)

    def kept(name: str) -> bool:
        parts = name.split(".")
        return parts[0] != "blk" or int(parts[1]) < layers

    return rewrite_gguf(source, path, keys=keys, keep=kept)


#: A key's new value for ``rewrite_gguf``: the value and its GGUF type (and an array's item type).
KeyValue = tuple[Any, gguf.GGUFValueType] | tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType]


def rewrite_gguf(
    source: Path,
    path: Path,
    *,
    keys: dict[str, KeyValue | None] | None = None,
    tensors: dict[str, np.ndarray | None] | None = None,
    keep: Callable[[str], bool] = lambda name: True,
    architecture: str | None = None,
) -> Path:
    """A copy of the GGUF at ``source`` with ``keys`` set (None removes one) and ``tensors`` set
    (an array, as numpy orders its dimensions: ggml's reversed; None removes one); of the other
    tensors, those ``keep`` names are copied as stored. ``architecture`` relabels the model (its
    ``ARCH.*`` keys renamed with it; ``keys`` are the new names). Crafted files start here."""
    keys, tensors = keys or {}, tensors or {}
    reader = read_gguf(source)
    source_architecture = str(reader.fields["general.architecture"].contents())
    architecture = architecture or source_architecture
    writer = gguf.GGUFWriter(str(path), architecture)
    for field in reader.fields.values():
        name = field.name
        if name.startswith(source_architecture + "."):
            name = architecture + name[len(source_architecture) :]
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue  # the writer writes the first ones itself
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for name, value in keys.items():
        if value is not None:
            writer.add_key_value(name, value[0], value[1], sub_type=value[2] if len(value) == 3 else None)
    for tensor in reader.tensors:
        if tensor.name not in tensors and keep(tensor.name):
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    for name, array in tensors.items():
        if array is not None:
            writer.add_tensor(name, array)
    _finish(writer)
    return path


#: The labels of ``write_qwen3_reranker``'s classification head, as llama.cpp's conversion of
#: Qwen3-Reranker names them: the score is the first one's probability.
RERANK_LABELS = ["yes", "no"]


def write_qwen3_reranker(
    source: Path, path: Path, layers: int = 4, seed: int = 0, rerank_template: str | None = None
) -> Path:
    """A Qwen3-architecture reranker made of the first ``layers`` blocks of SmolLM2 (``source``):
    its weights copied as stored, Qwen3's query and key norms as ones, and a random
    classification head (``cls.output.weight``, 2 x n_embd, float32: returned by
    ``reranker_head``) over the labels ``RERANK_LABELS``, pooled by RANK (llama.cpp then scores a
    sequence as the softmax of the head's outputs at its last token). ``rerank_template`` is
    written as ``tokenizer.chat_template.rerank``."""
    reader = read_gguf(source)
    n_embd = int(reader.fields["llama.embedding_length"].contents())
    head_width = n_embd // int(reader.fields["llama.attention.head_count"].contents())
    keys: dict[str, KeyValue | None] = {
        "qwen3.block_count": (layers, gguf.GGUFValueType.UINT32),
        "qwen3.pooling_type": (int(gguf.PoolingType.RANK), gguf.GGUFValueType.UINT32),
        "qwen3.classifier.output_labels": (RERANK_LABELS, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING),
    }
    if rerank_template is not None:
        keys["tokenizer.chat_template.rerank"] = (rerank_template, gguf.GGUFValueType.STRING)
    tensors: dict[str, np.ndarray | None] = {"cls.output.weight": reranker_head(n_embd, seed)}
    for block in range(layers):
        for norm in ("attn_q_norm", "attn_k_norm"):
            tensors[f"blk.{block}.{norm}.weight"] = np.ones(head_width, dtype=np.float32)

    def kept(name: str) -> bool:
        parts = name.split(".")
        return parts[0] != "blk" or int(parts[1]) < layers

    return rewrite_gguf(source, path, keys=keys, tensors=tensors, keep=kept, architecture="qwen3")


def reranker_head(n_embd: int, seed: int = 0) -> np.ndarray:
    """The classification head ``write_qwen3_reranker`` writes for ``seed``: one row per label."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((len(RERANK_LABELS), n_embd)) * 0.02).astype(np.float32)


def copy_vocabulary(source: Path, writer: gguf.GGUFWriter) -> int:
    """Writes every ``tokenizer.*`` key of the model at ``source`` (its vocabulary, merges and
    chat template) with ``writer``; returns the vocabulary's size."""
    reader = read_gguf(source)
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    return len(reader.fields[gguf.Keys.Tokenizer.LIST].data)


GPT2_WIDTH = 32
GPT2_LAYERS = 1


def write_tiny_gpt2(vocabulary_source: Path, path: Path, context: int, seed: int = 0) -> Path:
    """A 1-layer, 32-wide GPT-2 with random weights, learned position embeddings for
    ``context`` positions, and the vocabulary (every ``tokenizer.*`` key) of the model at
    ``vocabulary_source``: a draft model that passes the vocabulary check but holds fewer
    positions than its target."""
    writer = gguf.GGUFWriter(str(path), "gpt2")
    n_vocab = copy_vocabulary(vocabulary_source, writer)
    tensor = random_tensors(writer, seed)
    width = GPT2_WIDTH
    writer.add_name("tiny-gpt2")
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(4 * width)
    writer.add_block_count(GPT2_LAYERS)
    writer.add_head_count(2)
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(width, dtype=np.float32))

    tensor("token_embd.weight", n_vocab, width)
    tensor("position_embd.weight", context, width)
    norm("output_norm")
    for block in range(GPT2_LAYERS):
        norm(f"blk.{block}.attn_norm")
        tensor(f"blk.{block}.attn_qkv.weight", 3 * width, width)
        tensor(f"blk.{block}.attn_qkv.bias", 3 * width)
        tensor(f"blk.{block}.attn_output.weight", width, width)
        tensor(f"blk.{block}.attn_output.bias", width)
        norm(f"blk.{block}.ffn_norm")
        add_feed_forward(tensor, f"blk.{block}", width, 4 * width)
    _finish(writer)
    return path


def add_encoder_blocks(
    writer: gguf.GGUFWriter,
    tensor: Callable[..., None],
    tower: str,
    width: int,
    hidden: int,
    *,
    key_bias: bool = True,
) -> None:
    """Two transformer blocks of a projector's encoder (``{tower}.blk.N``, as clip names them):
    attention with biases (the key's when ``key_bias``), layer norms that start as identity, a
    feed-forward of ``hidden``. ``tensor`` is ``random_tensors``' writer."""
    for block in range(2):
        prefix = f"{tower}.blk.{block}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"{prefix}.{name}.weight", width, width)
            if key_bias or name != "attn_k":
                tensor(f"{prefix}.{name}.bias", width)
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"{prefix}.{name}.weight", np.ones(width, dtype=np.float32))
            writer.add_tensor(f"{prefix}.{name}.bias", np.zeros(width, dtype=np.float32))
        add_feed_forward(tensor, prefix, width, hidden)


PROJECTOR_IMAGE_SIZE = 64
PROJECTOR_PATCH = 16
PROJECTOR_WIDTH = 64
#: Embeddings of one image: one per patch.
PROJECTOR_TOKENS = (PROJECTOR_IMAGE_SIZE // PROJECTOR_PATCH) ** 2


def write_tiny_projector(path: Path, n_embd: int, seed: int = 0, scale: float = 0.3) -> Path:
    """A LLaVA-style vision projector (``clip.projector_type = "mlp"``) with random weights: a
    2-block, 64-wide vision tower for 64x64 images in 16-pixel patches, whose 16 embeddings are
    projected to ``n_embd`` (the text model's width). ``scale`` sizes the projection's weights:
    large enough that different images give different replies."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    u32 = {
        "image_size": PROJECTOR_IMAGE_SIZE,
        "patch_size": PROJECTOR_PATCH,
        "embedding_length": PROJECTOR_WIDTH,
        # Not the width: an old loader rule swaps the feed-forward weights when they are equal.
        "feed_forward_length": 2 * PROJECTOR_WIDTH,
        "block_count": 2,
        "attention.head_count": 2,
        "projection_dim": n_embd,
    }
    for key, value in u32.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    tensor = random_tensors(writer, seed)
    width, hidden = PROJECTOR_WIDTH, 2 * PROJECTOR_WIDTH
    tensor("v.patch_embd.weight", width, 3, PROJECTOR_PATCH, PROJECTOR_PATCH)
    tensor("v.position_embd.weight", PROJECTOR_TOKENS, width)
    add_encoder_blocks(writer, tensor, "v", width, hidden)
    tensor("mm.0.weight", hidden, width, scale=scale)
    tensor("mm.0.bias", hidden, scale=scale)
    tensor("mm.2.weight", n_embd, hidden, scale=scale)
    tensor("mm.2.bias", n_embd, scale=scale)
    _finish(writer)
    return path


AUDIO_PROJECTOR_WIDTH = 16
AUDIO_PROJECTOR_MEL_BINS = 80
#: llama.cpp cuts every clip into 30-second chunks of 3000 mel frames, which the stride-2 convolution halves.
AUDIO_PROJECTOR_POSITIONS = 1500
#: Encoder positions stacked into one embedding (``clip.audio.projector.stack_factor``); it divides 1500.
AUDIO_PROJECTOR_STACK = 60
#: Embeddings of one clip (of each 30-second chunk of a longer one): 1500 positions / 60.
AUDIO_PROJECTOR_TOKENS = AUDIO_PROJECTOR_POSITIONS // AUDIO_PROJECTOR_STACK
#: The sample rate llama.cpp's loader sets for a Whisper-style encoder (the file cannot change it).
AUDIO_PROJECTOR_SAMPLE_RATE = 16000


def write_tiny_audio_projector(path: Path, n_embd: int, seed: int = 0, scale: float = 0.3) -> Path:
    """An Ultravox-style audio projector (``clip.projector_type = "ultravox"``) with random
    weights: a 2-block, 16-wide Whisper encoder over 80 mel bins whose 1500 positions are stacked
    60 at a time into 25 embeddings projected to ``n_embd`` (the text model's width). The loader
    imposes the rest: 16 kHz audio, cut into 30-second chunks (a shorter clip padded with silence,
    so any clip of 2 samples up to 30 s gives one chunk of 25 embeddings; one sample aborts), a
    kernel-3 convolution pair, at least 1500 position embeddings, attention biases on q, v and out
    but none on k, ``clip.audio.projector.stack_factor`` and the ``u32``/``f32`` key types.
    ``scale`` sizes the projection's weights: large enough that different clips give different
    replies."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "ultravox")
    width, hidden, stack = AUDIO_PROJECTOR_WIDTH, 2 * AUDIO_PROJECTOR_WIDTH, AUDIO_PROJECTOR_STACK
    u32 = {
        "num_mel_bins": AUDIO_PROJECTOR_MEL_BINS,
        "embedding_length": width,
        "feed_forward_length": hidden,
        "block_count": 2,
        "attention.head_count": 2,
        "projection_dim": n_embd,
        "projector.stack_factor": stack,
    }
    for key, value in u32.items():
        writer.add_uint32(f"clip.audio.{key}", value)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    tensor = random_tensors(writer, seed)
    # numpy shapes are ggml's reversed: conv1d.1 is [kernel, n_mel, width] in ggml, its bias [1, width].
    tensor("a.conv1d.1.weight", width, AUDIO_PROJECTOR_MEL_BINS, 3)
    tensor("a.conv1d.1.bias", width, 1)
    tensor("a.conv1d.2.weight", width, width, 3)
    tensor("a.conv1d.2.bias", width, 1)
    tensor("a.position_embd.weight", AUDIO_PROJECTOR_POSITIONS, width)
    # Whisper's key projection has no bias; the graph asserts there is none.
    add_encoder_blocks(writer, tensor, "a", width, hidden, key_bias=False)
    # Projector: RMS norm, mlp.1 to 2*hidden, SwiGLU to hidden, RMS norm, mlp.2 to n_embd (no biases).
    writer.add_tensor("mm.a.norm_pre.weight", np.ones(width * stack, dtype=np.float32))
    tensor("mm.a.mlp.1.weight", 2 * hidden, width * stack, scale=scale)
    writer.add_tensor("mm.a.norm_mid.weight", np.ones(hidden, dtype=np.float32))
    tensor("mm.a.mlp.2.weight", n_embd, hidden, scale=scale)
    _finish(writer)
    return path


QWEN2VL_WIDTH = 64
QWEN2VL_LAYERS = 2
QWEN2VL_HEADS = 4  # heads of 16
QWEN2VL_KV_HEADS = 2  # grouped-query attention, as Qwen2-VL
QWEN2VL_FF = 128
QWEN2VL_CONTEXT = 4096
#: M-RoPE sections (temporal, height, width, unused) of a head's 8 rotated pairs: Qwen2-VL's
#: [16, 24, 24] for heads of 128, scaled to heads of 16. llama.cpp reads exactly 4 and requires the key.
QWEN2VL_ROPE_SECTIONS = [2, 3, 3, 0]
#: Scale of the attention and feed-forward outputs: with the output tied to token_embd, the 0.1 of
#: the other weights leaves the last token's embedding dominating the residual, and the model echoes
#: it ("\n" forever) whatever the image; at 0.5 the layers (and so the image) decide the reply.
QWEN2VL_OUTPUT_SCALE = 0.5

QWEN2VL_IMAGE_SIZE = 56
QWEN2VL_PATCH = 14
QWEN2VL_MERGE = 2  # llama.cpp's default spatial merge for qwen2vl_merger: 2 x 2 patches per embedding
QWEN2VL_VISION_WIDTH = 64  # 2 heads of 32: the vision M-RoPE splits each head in 4 sections of 8
QWEN2VL_VISION_HEADS = 2
QWEN2VL_VISION_FF = 128
#: Embeddings of one QWEN2VL_IMAGE_SIZE image: a 2 x 2 grid of merged 28-pixel cells.
QWEN2VL_GRID = QWEN2VL_IMAGE_SIZE // (QWEN2VL_PATCH * QWEN2VL_MERGE)
QWEN2VL_IMAGE_TOKENS = QWEN2VL_GRID * QWEN2VL_GRID
#: Positions one such image takes with M-RoPE: max(grid width, grid height).
QWEN2VL_IMAGE_POSITIONS = QWEN2VL_GRID


def write_tiny_qwen2vl(
    model_path: Path, projector_path: Path, vocabulary_source: Path, seed: int = 0, *, scale: float = 1.0
) -> tuple[Path, Path]:
    """A 2-layer, 64-wide Qwen2-VL text model with random weights and the vocabulary (every
    ``tokenizer.*`` key, chat template included) of the model at ``vocabulary_source``, written to
    ``model_path``, and its vision projector, written to ``projector_path``: a 2-block, 64-wide
    vision tower in 14-pixel patches whose 2 x 2 merged patches are projected to the text model's
    width. A 56 x 56 image is encoded as is, as 4 embeddings on 2 M-RoPE positions. ``scale``
    sizes the projection's weights: large enough that different images give different replies."""
    return (
        _write_qwen2vl_text(model_path, vocabulary_source, seed),
        _write_qwen2vl_projector(projector_path, QWEN2VL_WIDTH, seed + 1, scale),
    )


def _write_qwen2vl_text(path: Path, vocabulary_source: Path, seed: int) -> Path:
    writer = gguf.GGUFWriter(str(path), "qwen2vl")
    n_vocab = copy_vocabulary(vocabulary_source, writer)
    width, ff = QWEN2VL_WIDTH, QWEN2VL_FF
    kv_width = width // QWEN2VL_HEADS * QWEN2VL_KV_HEADS
    writer.add_name("tiny-qwen2vl")
    writer.add_context_length(QWEN2VL_CONTEXT)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ff)
    writer.add_block_count(QWEN2VL_LAYERS)
    writer.add_head_count(QWEN2VL_HEADS)
    writer.add_head_count_kv(QWEN2VL_KV_HEADS)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_rope_dimension_sections(QWEN2VL_ROPE_SECTIONS)  # an int32 array
    # Written as converted files do; this llama.cpp's qwen2vl loader does not read it (its RMS
    # norms run with an epsilon of 0), which only matters for an all-zero row.
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    tensor = random_tensors(writer, seed)

    # The embedding (49152 x 64, tied to the output: no "output.weight") would be 12.6 MB as
    # float32; Q4_0 makes it 1.8 MB, next to the vocabulary's 2 MB.
    rng = np.random.default_rng([seed, 1])  # not random_tensors' stream
    embedding = (rng.standard_normal((n_vocab, width)) * 0.5).astype(np.float32)
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    quantized = gguf.quants.quantize(embedding, q4_0)
    writer.add_tensor("token_embd.weight", quantized, raw_shape=quantized.shape, raw_dtype=q4_0)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(width, dtype=np.float32))

    norm("output_norm.weight")
    # numpy shapes are ggml's reversed: attn_k is [n_embd, n_embd_kv] in ggml.
    for block in range(QWEN2VL_LAYERS):
        prefix = f"blk.{block}"
        norm(f"{prefix}.attn_norm.weight")
        for part, rows in (("attn_q", width), ("attn_k", kv_width), ("attn_v", kv_width)):
            tensor(f"{prefix}.{part}.weight", rows, width)
            tensor(f"{prefix}.{part}.bias", rows)  # Qwen2's q, k and v have biases, its output none
        tensor(f"{prefix}.attn_output.weight", width, width, scale=QWEN2VL_OUTPUT_SCALE)
        norm(f"{prefix}.ffn_norm.weight")
        tensor(f"{prefix}.ffn_gate.weight", ff, width)
        tensor(f"{prefix}.ffn_up.weight", ff, width)
        tensor(f"{prefix}.ffn_down.weight", width, ff, scale=QWEN2VL_OUTPUT_SCALE)
    _finish(writer)
    return path


def _write_qwen2vl_projector(path: Path, n_embd: int, seed: int, scale: float) -> Path:
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "qwen2vl_merger")
    width, hidden, patch = QWEN2VL_VISION_WIDTH, QWEN2VL_VISION_FF, QWEN2VL_PATCH
    u32 = {
        "image_size": QWEN2VL_IMAGE_SIZE,
        "patch_size": patch,
        "embedding_length": width,
        # Not the width: the loader swaps ffn_up and ffn_down of qwen2vl_merger when they are equal.
        "feed_forward_length": hidden,
        "block_count": 2,  # add_encoder_blocks writes 2
        "attention.head_count": QWEN2VL_VISION_HEADS,
        "projection_dim": n_embd,
        # llama.cpp's default for qwen2vl_merger is at least 8 embeddings (a 56-pixel image would be
        # upscaled to 84): 4 lets a QWEN2VL_IMAGE_SIZE image through as is; 16 bounds an encode.
        "image_min_pixels": QWEN2VL_IMAGE_TOKENS * (patch * QWEN2VL_MERGE) ** 2,
        "image_max_pixels": 16 * (patch * QWEN2VL_MERGE) ** 2,
    }
    for key, value in u32.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])  # CLIP's, as Qwen2-VL
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    tensor = random_tensors(writer, seed)
    # Qwen2-VL's Conv3d patch embedding over 2 frames, split into one kernel per frame (a still
    # image goes through both); no bias (the graph asserts there is none), no position embedding
    # (the tower places patches with M-RoPE).
    tensor("v.patch_embd.weight", width, 3, patch, patch)
    tensor("v.patch_embd.weight.1", width, 3, patch, patch)
    add_encoder_blocks(writer, tensor, "v", width, hidden)
    # The merger: its LayerNorm (ln_q, as v.post_ln), then an MLP over 2 x 2 patches concatenated,
    # mm.0 (4*width -> 4*width), GELU, mm.2 (-> n_embd), all with biases (the loader requires them).
    writer.add_tensor("v.post_ln.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("v.post_ln.bias", np.zeros(width, dtype=np.float32))
    merged = width * QWEN2VL_MERGE * QWEN2VL_MERGE
    # mm.0 keeps the merged patches' unit variance; mm.2 at ``scale`` makes image embeddings of std
    # about 10 (the text's are 0.5), which the decoder's RMS norms bring back.
    tensor("mm.0.weight", merged, merged, scale=1 / np.sqrt(merged))
    tensor("mm.0.bias", merged, scale=1 / np.sqrt(merged))
    tensor("mm.2.weight", n_embd, merged, scale=scale)
    tensor("mm.2.bias", n_embd, scale=scale)
    _finish(writer)
    return path
