"""Prompts and checks the speculative decoding tests share."""

from __future__ import annotations

from typing import Any

import llamactx
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
