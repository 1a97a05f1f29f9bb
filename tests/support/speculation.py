"""Prompts and checks the speculative decoding tests share (and benches/speculative.py, its quoted texts)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import llamactx
from support.cpus import threads
from support.prompts import HELPFUL

OPTIONS: dict[str, Any] = {"n_ctx": 4096, "n_seq_max": 4, "prefix_cache": False}

CODE = """def compute_total(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    total = subtotal + tax
    return round(total, 2)


def format_receipt(items, tax_rate):
    lines = []
    for item in items:
        lines.append(f"{item.name}: {item.price * item.quantity:.2f}")
    lines.append(f"Total: {compute_total(items, tax_rate):.2f}")
    return "\\n".join(lines)
"""
#: Output that quotes its input: drafts are accepted, and rejected where the name changes.
GROUNDED = [
    {"role": "system", "content": HELPFUL},
    {"role": "user", "content": f"Repeat this code exactly, but rename compute_total to compute_sum:\n\n{CODE}"},
]
#: Texts SmolLM2-135M repeats word for word when asked (its replies equal them): one
#: description with eight sets of names and numbers.
QUOTED_TEXTS = [
    (
        f"The {place} Observatory was built in {built} on a granite ridge above the village of {village}. "
        f"Its first director, {founder}, catalogued {stars} variable stars between {start} and {end}, working "
        f"mostly alone through the long northern winters. The main telescope, a {size}-centimetre refractor "
        f"made in {maker}, was moved to the university in {moved}, and the dome now houses a small museum. "
        "Visitors can see the handwritten logbooks, the original brass clock drive, and a photographic plate "
        f"of the {eclipse} solar eclipse. The museum is open from May to September, Tuesday to Sunday, from "
        f"10 am to 5 pm. Admission is free for children under twelve; adults pay {fee} kronor."
    )
    for place, built, village, founder, stars, start, end, size, maker, moved, eclipse, fee in (
        fields.split("|")
        for fields in [
            "Lindqvist|1911|Norrvik|Astrid Lindqvist|4,212|1912|1938|60|Hamburg|1957|1927|80",
            "Berg|1903|Solvik|Maria Berg|3,118|1905|1931|45|Jena|1949|1914|60",
            "Holm|1921|Ekby|Nils Holm|5,004|1922|1950|75|Munich|1962|1936|90",
            "Dahl|1898|Granö|Karin Dahl|2,871|1899|1925|38|Vienna|1940|1905|50",
            "Sund|1915|Lövnäs|Erik Sund|4,650|1916|1944|55|Berlin|1958|1927|70",
            "Ström|1909|Åsen|Ingrid Ström|3,902|1910|1936|50|Dresden|1952|1912|65",
            "Falk|1925|Björkö|Olof Falk|6,120|1926|1955|80|Paris|1966|1945|100",
            "Lund|1901|Hammar|Greta Lund|2,540|1902|1929|40|London|1947|1905|55",
        ]
    )
]


def quote_request(text: str) -> str:
    """A user's request to repeat ``text``."""
    return f"Repeat the following text exactly, word for word:\n\n{text}"


QUOTE = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": quote_request(QUOTED_TEXTS[0])}]
FREE = [
    {"role": "system", "content": HELPFUL},
    {"role": "user", "content": "Write a short story about a dragon who learns to paint."},
]
#: A completion whose form repeats (the labels), not its content (the values): drafts of the
#: labels are accepted, those of the values mostly rejected.
RECORDS = (
    "".join(
        f"Name: {name}\nAge: {age}\nCity: {city}\n\n"
        for name, age, city in [("Alice", 30, "Paris"), ("Bob", 25, "Rome"), ("Carol", 35, "Oslo")]
    )
    + "Name:"
)


def same_output(first: llamactx.Completion, second: llamactx.Completion) -> None:
    assert first.tokens == second.tokens
    assert first.text == second.text
    assert first.finish_reason == second.finish_reason
    assert first.completion_tokens == second.completion_tokens


#: How far apart two candidates for a greedy token may be, or a greedy token may fall below the
#: model's best, when read again in one decode of the whole: a decode's numbers depend a little
#: on its shape (how many tokens, of which sequences), and so do the kernels a CPU build
#: chooses. Measured: up to 0.34 for replies equal to decoding alone (one decode of 500 tokens is
#: not 500 decodes of one); three requests at once without drafts moved two candidates by 0.09
#: and changed a greedy token where they were 0.06 apart; a token replaced by the one before it
#: fell 16.9 below the best.
BATCHING_TOLERANCE = 1.0


def logits_after(model: llamactx.LlamaModel, prompt: list[int], generated: list[int]) -> Iterator[np.ndarray]:
    """The model's logits after ``prompt``, then after each of ``generated`` in turn, read in one
    decode of the whole (``len(generated) + 1`` rows)."""
    tokens = prompt + generated
    size = len(tokens)
    with model.new_context(
        n_ctx=size, n_batch=size, n_ubatch=size, n_threads=threads(), n_threads_batch=threads()
    ) as ctx:
        batch = llamactx.LlamaBatch(size)
        for position, token in enumerate(tokens):
            batch.add(token, position, [0], position >= len(prompt) - 1)
        ctx.decode(batch)
        for row in range(len(generated) + 1):
            yield ctx.get_logits_ith(len(prompt) - 1 + row)


def worst_greedy_gap(model: llamactx.LlamaModel, prompt: list[int], generated: list[int]) -> float:
    """The most any of ``generated`` falls below the model's best token in log-probability, each
    read after ``prompt`` and the tokens before it in one decode of the whole (0 where every
    one was the best)."""
    worst = 0.0
    for logits, token in zip(logits_after(model, prompt, generated), generated, strict=False):  # one row more
        worst = max(worst, float(logits.max() - logits[token]))
    return worst


def same_greedy_tokens(model: llamactx.LlamaModel, prompt: list[int], first: list[int], second: list[int]) -> bool:
    """Whether two greedy generations after ``prompt`` are equal; where they are not, asserts
    that they part at a near-tie: the two tokens chosen there (or a token and the end of
    generation) within ``BATCHING_TOLERANCE`` of each other, read in one decode of what came
    before. Decodes of other shapes (drafts verified together, requests sharing a decode)
    choose differently only there; a drafted token kept after its rejection would not pass."""
    if first == second:
        return True
    pairs = enumerate(zip(first, second, strict=False))
    parted = next((i for i, (a, b) in pairs if a != b), min(len(first), len(second)))
    *_, logits = logits_after(model, prompt, first[:parted])
    ends = [token for token in range(model.n_vocab()) if model.is_eog_token(token)]

    def chosen(tokens: list[int]) -> float:
        return float(logits[tokens[parted]] if parted < len(tokens) else logits[ends].max())

    gap = abs(chosen(first) - chosen(second))
    assert gap < BATCHING_TOLERANCE, f"parted at token {parted} between candidates {gap:.3f} apart"
    return False


def same_greedy_output(
    model: llamactx.LlamaModel, prompt: list[int], first: llamactx.Completion, second: llamactx.Completion
) -> None:
    """``same_output``, or a parting at a near-tie (``same_greedy_tokens``)."""
    if same_greedy_tokens(model, prompt, first.tokens, second.tokens):
        same_output(first, second)


def same_greedy_text(model: llamactx.LlamaModel, prompt: list[int], first: str, second: str) -> bool:
    """``same_greedy_tokens`` for replies the library returns as text: whether they are equal,
    else where they part is found in their tokens again."""
    if first == second:
        return True
    tokens = [model.str_to_token(text, False, special=False) for text in (first, second)]
    return same_greedy_tokens(model, prompt, *tokens)
