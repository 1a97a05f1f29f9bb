"""How many tokens a prompt holds, by the served model's own tokenizer and chat template: where
llama.cpp's tests assert their model's exact counts, ours assert these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import llamactx


def text_tokens(vocab: llamactx.LlamaModel, text: str) -> list[int]:
    """``text`` as a prompt: with the BOS (and EOS) the model's tokenizer adds."""
    return vocab.str_to_token(text, True, special=False)


def chat_tokens(vocab: llamactx.LlamaModel, messages: Sequence[Mapping[str, object]], prefill: str = "") -> int:
    """The tokens of ``messages`` (text contents) rendered with the model's template for the
    assistant's reply (after ``prefill``, the text the reply continues); the chat must open with a
    system message, so that the template adds no default one."""
    pairs = [(str(message["role"]), message["content"]) for message in messages]
    texts = [(role, content) for role, content in pairs if isinstance(content, str)]
    assert len(texts) == len(pairs), "text contents only"
    prompt = vocab.apply_chat_template(texts, add_ass=True) + prefill
    return len(vocab.str_to_token(prompt, True, special=True))
