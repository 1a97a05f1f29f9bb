"""Speculative decoding against the same engine without it, in one run, alternating round by
round: aggregate tokens/s of greedy chat replies on three tasks, by one request alone and by eight
at once, for

- "ngram": ``NgramDraft()``, n-gram lookup in each request's own text;
- "draft": ``DraftModel(...)``, a draft model: SmolLM2 cut to its first ``--draft-layers`` layers
  (no smaller model of its vocabulary exists; a cut one costs most of what SmolLM2 does per
  token, so this measures the machinery's overhead and the gate, not a realistic pairing);
- "draft always": the same with ``only_where_faster=False``: drafting at every step.

- "quote": repeat a ~170-token text word for word (the reply quotes its input, and SmolLM2-135M
  does: its replies equal the texts, but for one letter left out in three of the eight);
- "code edit": repeat a ~300-token code block with one name changed (the issue's example; the
  135M model does not follow it: it writes a function of its own, then repeats a phrase);
- "free": a short story (nothing to quote).

Each request is submitted with its own prompt (the eight differ in the text to quote, the name
asked for, or the story's subject) and the prefix cache off; the eight prompts are read in one
step. Tokens/s count from the first token sampled to the last (each request's first token
follows its prompt; the tokens after it are what speculation speeds up). The replies are
greedy and equal with and without drafts (tests/engine/test_speculative.py), so both engines do the
same work; a ratio is the median of the rounds' ratios.

    python benches/speculative.py [--rounds 3] [--max-tokens 200] [--threads 2] [--draft-layers 26]
        [--kinds ngram draft "draft always"] [--tasks quote "code edit" free] [--counts 1 8]
        [--out bench-results]

First it measures what verification costs here: milliseconds of a decode of one token alone,
and of 17 (a token and a 16-token draft), for 1 and 8 sequences, every token with an output;
their ratios per token are the ceilings: what drafting could gain were every draft accepted.
Then what uneven drafts cost with a KV stream per sequence: 8 sequences each bringing 4
tokens, against the first 4 of them and every other one doing so (the others 1).

Writes speculative.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llamactx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import synthetic  # the tests' GGUF writers
from support.speculation import QUOTED_TEXTS, quote_request

CODE = """class Inventory:
    def __init__(self):
        self.items = {}

    def add_item(self, name, price, quantity=1):
        if name in self.items:
            self.items[name]["quantity"] += quantity
        else:
            self.items[name] = {"price": price, "quantity": quantity}

    def remove_item(self, name, quantity=1):
        if name not in self.items:
            raise KeyError(name)
        self.items[name]["quantity"] -= quantity
        if self.items[name]["quantity"] <= 0:
            del self.items[name]

    def compute_total(self, tax_rate):
        subtotal = 0
        for item in self.items.values():
            subtotal += item["price"] * item["quantity"]
        return round(subtotal * (1 + tax_rate), 2)

    def format_receipt(self, tax_rate):
        lines = []
        for name, item in self.items.items():
            lines.append(f"{name}: {item['price'] * item['quantity']:.2f}")
        lines.append(f"Total: {self.compute_total(tax_rate):.2f}")
        return "\\n".join(lines)
"""
NEW_NAMES = ["compute_sum", "total_due", "grand_total", "amount_owed", "final_total", "sum_all", "get_total", "price"]
SUBJECTS = ["a dragon who learns to paint", "a lighthouse keeper", "a robot gardener", "two rival bakers"]
SUBJECTS += ["a lost kitten in a city", "a sailor's last voyage", "a haunted library", "a town without music"]
TASKS = ("quote", "code edit", "free")
KINDS = ("ngram", "draft", "draft always")
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
#: The draft model's layers, of SmolLM2's 30: with fewer, it agrees with SmolLM2 on almost nothing.
DRAFT_LAYERS = 26


def draft_file(model: Path, directory: Path, layers: int = DRAFT_LAYERS) -> Path:
    """The bench's draft model: ``model`` cut to its first ``layers`` layers, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return synthetic.write_first_layers(model, directory / f"draft-{layers}-layers.gguf", layers)


def chats(task: str, count: int) -> list[list[dict[str, str]]]:
    if task == "quote":
        asks = [quote_request(text) for text in QUOTED_TEXTS]
    elif task == "code edit":
        asks = [f"Repeat this code exactly, but rename compute_total to {name}:\n\n{CODE}" for name in NEW_NAMES]
    else:
        asks = [f"Write a short story about {subject}." for subject in SUBJECTS]
    return [[SYSTEM, {"role": "user", "content": ask}] for ask in asks[:count]]


def rate(engine: llamactx.Engine, conversations: list[list[dict[str, str]]], max_tokens: int) -> dict[str, float]:
    """Generated tokens/s of ``conversations`` submitted at once, from the first token sampled to
    the last (prompt reading excluded, as llama-bench's tg), and the share of drafted tokens
    accepted."""
    submitted = time.perf_counter()
    requests = [engine.submit_chat(messages, max_tokens=max_tokens) for messages in conversations]
    completions = [request.result() for request in requests]
    firsts = [submitted + (completion.first_token_seconds or 0.0) for completion in completions]
    lasts = [
        first + (completion.completion_tokens - 1) / completion.tokens_per_second
        for first, completion in zip(firsts, completions, strict=True)
    ]
    tokens = sum(completion.completion_tokens for completion in completions) - len(completions)
    drafted = sum(completion.drafted_tokens for completion in completions)
    accepted = sum(completion.accepted_tokens for completion in completions)
    return {
        "tokens_per_second": tokens / (max(lasts) - min(firsts)),
        "acceptance": accepted / drafted if drafted else 0.0,
    }


#: Decodes whose costs bound what verifying drafts can gain, and what uneven drafts cost: the
#: tokens each sequence brings (its own and its draft's).
STEP_SHAPES = {
    "1 x 1": [1],
    "1 x 17": [17],
    "8 x 1": [1] * 8,
    "8 x 17": [17] * 8,
    "8 x 4": [4] * 8,
    "8, the first 4 x 4": [4] * 4 + [1] * 4,
    "8, every other x 4": [4, 1] * 4,
}
#: Where in each sequence the measured tokens go (about where the tasks' replies are).
STEP_POSITION = 300


def step_costs(model: llamactx.LlamaModel, threads: int, repeats: int = 7) -> dict[str, float]:
    """Milliseconds of decodes of each of ``STEP_SHAPES``, every token with an output (as a
    step that verifies drafts has), after ``STEP_POSITION`` tokens in each sequence; the median
    of ``repeats``. One token alone is a plain step of one request; 17 are its token and a
    16-token draft."""
    ctx = model.new_context(n_ctx=8 * 512, n_batch=512, n_seq_max=8, n_threads=threads, n_threads_batch=threads)
    tokens = model.str_to_token("The observatory is open from May to September. " * 40, True)[:STEP_POSITION]
    for seq in range(8):
        batch = llamactx.LlamaBatch(STEP_POSITION, 1)
        batch.add_sequence(tokens, seq, False)
        ctx.decode(batch)
    costs = {}
    for name, counts in STEP_SHAPES.items():
        seconds = []
        for _ in range(repeats):
            batch = llamactx.LlamaBatch(sum(counts), 1)
            for seq, count in enumerate(counts):
                for offset in range(count):
                    batch.add(tokens[offset], STEP_POSITION + offset, [seq], True)
            started = time.perf_counter()
            ctx.decode(batch)
            seconds.append(time.perf_counter() - started)
            for seq in range(len(counts)):
                ctx.clear_kv_cache_seq(seq, STEP_POSITION, None)
        costs[name] = 1000 * statistics.median(seconds)
    return costs


def ceilings(costs: dict[str, float]) -> dict[str, float]:
    """The most drafting can gain at 1 and 8 requests: a step's cost per token alone against
    with 16-token drafts all accepted."""
    return {f"{n} request(s)": 17 * costs[f"{n} x 1"] / costs[f"{n} x 17"] for n in (1, 8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--draft-layers", type=int, default=DRAFT_LAYERS)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="the drafting measured")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--counts", nargs="+", type=int, choices=(1, 8), default=[1, 8], help="requests at once")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(arguments.model or llamactx.default_model_path())
    options = {
        "n_ctx": 8 * 640,
        # All eight prompts are read in the first step: from the first token on, the eight
        # requests generate together (with a smaller batch, the later prompts' reading would
        # fall inside the measured window, in both engines alike).
        "n_batch": 8 * 640,
        "n_seq_max": 8,
        "prefix_cache": False,
        "n_threads": arguments.threads,
        "n_threads_batch": arguments.threads,
    }
    costs = step_costs(model, arguments.threads)
    gains_at_most = ceilings(costs)
    print(json.dumps({"step_ms": costs, "ceilings": gains_at_most}), flush=True)
    with tempfile.TemporaryDirectory() as directory:
        draft = llamactx.LlamaModel.load_from_file(draft_file(model.path, Path(directory), arguments.draft_layers))
    every_kind: dict[str, llamactx.NgramDraft | llamactx.DraftModel] = {
        "ngram": llamactx.NgramDraft(),
        "draft": llamactx.DraftModel(draft),
        "draft always": llamactx.DraftModel(draft, only_where_faster=False),
    }
    drafting = {name: every_kind[name] for name in arguments.kinds}
    engines = {name: llamactx.Engine(model, speculative=kind, **options) for name, kind in drafting.items()}
    engines["plain"] = llamactx.Engine(model, **options)
    cases = [(task, count) for count in arguments.counts for task in arguments.tasks]
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for round_index in range(arguments.rounds):
            names = list(engines)[round_index % len(engines) :] + list(engines)[: round_index % len(engines)]
            for task, count in cases:
                for name in names:
                    measured = rate(engines[name], chats(task, count), arguments.max_tokens)
                    runs.setdefault(f"{task} x{count} {name}", []).append(measured)
                    print(f"round {round_index}: {task} x{count} {name}: {measured}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    ratios = {
        f"{task} x{count}: {name} / plain": statistics.median(
            drafted["tokens_per_second"] / plain["tokens_per_second"]
            for drafted, plain in zip(runs[f"{task} x{count} {name}"], runs[f"{task} x{count} plain"], strict=True)
        )
        for name in drafting
        for task, count in cases
    }
    acceptance = {
        f"{task} x{count} {name}": statistics.median(run["acceptance"] for run in runs[f"{task} x{count} {name}"])
        for name in drafting
        for task, count in cases
    }
    settings = {**vars(arguments), "out": str(arguments.out), "speculative": "NgramDraft() and DraftModel() defaults"}
    result = {
        "settings": settings,
        "step_ms": costs,
        "ceilings": gains_at_most,
        "ratios": ratios,
        "acceptance": acceptance,
        "runs": runs,
    }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "speculative.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"ratios": ratios, "acceptance": acceptance}, indent=2))


if __name__ == "__main__":
    main()
