"""Tiny GGUF files written with the ``gguf`` package: a random BERT encoder (for ``encode``),
a random LoRA adapter for SmolLM2 (for ``lora_adapter_*``) and vocabulary-only models."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

BERT_WIDTH = 32
BERT_LAYERS = 2
BERT_CONTEXT = 128
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "in", "park", "sun", "is", "hot", "cold", "day", "night"]
WORD_START = "\u2581"  # llama.cpp's WPM vocabulary marks word-initial pieces with it


def bert_vocabulary() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [WORD_START + w for w in WORDS + letters] + letters + [".", ",", "!", "?"]
    # llama.cpp aborts on a vocabulary with duplicates, so keep the first of each.
    return SPECIALS + list(dict.fromkeys(pieces))


def write_tiny_bert(path: Path, seed: int = 0, duplicate_token: bool = False) -> Path:
    """A 2-layer, 32-wide BERT with random weights, MEAN pooling and a WordPiece vocabulary
    (with ``duplicate_token``, one that lists a token twice: llama.cpp aborts on those)."""
    rng = np.random.default_rng(seed)
    vocab = bert_vocabulary()
    if duplicate_token:
        vocab[-1] = vocab[-2]
    writer = gguf.GGUFWriter(str(path), "bert")
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

    def tensor(name: str, *shape: int, scale: float = 0.1) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

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
        tensor(f"blk.{block}.ffn_up.weight", 2 * width, width)
        tensor(f"blk.{block}.ffn_up.bias", 2 * width)
        tensor(f"blk.{block}.ffn_down.weight", width, 2 * width)
        tensor(f"blk.{block}.ffn_down.bias", width)
        norm(f"blk.{block}.layer_output_norm")
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
