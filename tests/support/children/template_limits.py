"""Child program: chat templates that pass the work limit where counting allocations alone could
not stop them safely (the third red team's findings 4 and 5). Each case prints what it measured;
the process must survive, and a case leaves behind at most a thread still working past its
deadline, which ``os._exit`` ends with the process."""

from __future__ import annotations

import os
import resource
import time

import harness

import llamactx
from llamactx._llamactx import _ChatTemplates

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
#: A template that renders the messages and tools as JSON again and again before the chat: the
#: template's capability analysis renders it too, and a loop of a few thousand passes the work
#: limit there, inside code that catches the error and then destroys JSON values.
LOOPING_OVER_JSON = "{% for i in range(COUNT) %}{{ messages|tojson }}{{ tools|tojson }}{% endfor %}" + CHATML


def outcome(model: llamactx.LlamaModel, template: str) -> str:
    """What parsing (and so analysing) ``template`` ends in."""
    try:
        _ChatTemplates(model, template)
    except llamactx.ChatTemplateError as error:
        return f"{error.kind}: {error}"
    return "parsed"


def work_limit_reached_inside_the_template_analysis(model: llamactx.LlamaModel) -> None:
    """Loops of 3,000 to 9,750 passes, so the limit is reached at as many points of the
    analysis: each is refused (or parses), and the process lives on."""
    for count in range(3000, 10_000, 250):
        print("COUNT", count, outcome(model, LOOPING_OVER_JSON.replace("COUNT", str(count))))
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1, chat_template=CHATML) as engine:
        print("AFTER", len(engine.chat_tokens(QUESTION)) > 0, flush=True)


def string_work_the_count_cannot_see(model: llamactx.LlamaModel) -> None:
    """``replace`` on 600,000 characters moves the string's tail for every match (quadratic) and
    allocates almost nothing: the call returns at its deadline, its thread left to finish."""
    template = '{% set text = "ab" * 300000 %}{{ text.replace("a", "aa") }}<|im_start|>assistant\n'
    started = time.monotonic()
    print("OUTCOME", outcome(model, template), flush=True)
    print("SECONDS", round(time.monotonic() - started, 1), flush=True)
    os._exit(0)


def memory_the_count_cannot_see(model: llamactx.LlamaModel) -> None:
    """Twenty ``indent``s of 100,000,000 spaces each: the C++ runtime's own string code makes
    them (uncounted where it is a shared library), about 2 GB a render, and the analysis renders
    it many times; the heap's growth or the time stops it."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    template = '{% for i in range(20) %}{{ "a\nb"|indent(100000000) }}{% endfor %}<|im_start|>assistant\n'
    started = time.monotonic()
    print("OUTCOME", outcome(model, template), flush=True)
    print("SECONDS", round(time.monotonic() - started, 1), flush=True)
    print("GREW_MB", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, flush=True)


if __name__ == "__main__":
    harness.run(
        work_limit_reached_inside_the_template_analysis, string_work_the_count_cannot_see, memory_the_count_cannot_see
    )
