"""Structured output in one run, every figure against a baseline measured in the same run:

1. tokens/s of generation constrained by a JSON Schema against unconstrained generation of the
   same length (end of generation banned), one sequence with ``generate`` and 8 at once in the
   ``Engine``, alternating round by round;
2. llguidance's mask time per token (µs): ``apply`` of the constraint on a full row of
   candidates, less ``apply`` of a stage that only reads them, along a valid output;
3. with --peer-python, the test corpus (tests/support/json_schema_corpus.json) through llama-cpp-python's
   converter (``LlamaGrammar.from_json_schema``) beside llamactx: schemas compiled, outputs that
   finished, outputs that validate (benches/peer_llama_cpp_python_schemas.py).

    python benches/structured.py [--rounds 3] [--threads 2] [--out bench-results]
                                 [--peer-python .venv-peers/bin/python] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
from batched import no_eog_sampler

import llamactx

CORPUS = Path(__file__).parent.parent / "tests" / "support" / "json_schema_corpus.json"
PEOPLE = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 24},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    },
}
PROMPT = [("user", "List many people as JSON, with name, age and city.")]


def tokens_per_second(run: Any, tokens: int) -> float:
    started = time.perf_counter()
    run()
    return tokens / (time.perf_counter() - started)


def generation_overhead(model: llamactx.LlamaModel, threads: int, rounds: int, tg: int) -> dict[str, Any]:
    schema = json.dumps(PEOPLE)
    ctx = model.new_context(n_ctx=1024, n_threads=threads, n_threads_batch=threads)
    prompt = model.apply_chat_template(PROMPT, None, True)
    single: dict[str, list[float]] = {"unconstrained": [], "json_schema": []}
    engine_runs: dict[str, list[float]] = {"unconstrained": [], "json_schema": []}
    banned = {t: float("-inf") for t in range(model.n_vocab()) if model.is_eog_token(t)}
    greedy_no_eog = llamactx.SamplingParams(temperature=0, logit_bias=banned)
    with llamactx.Engine(model, n_ctx=8 * 1024, n_seq_max=8, n_threads=threads, n_threads_batch=threads) as engine:
        for _ in range(rounds):
            for kind in single:
                options: dict[str, Any] = {"json_schema": schema} if kind == "json_schema" else {}
                sampler = None if options else no_eog_sampler(model)

                def one(options: dict[str, Any] = options, sampler: Any = sampler) -> None:
                    llamactx.generate(ctx, prompt, max_tokens=tg, sampler=sampler, **options)

                def eight(options: dict[str, Any] = options) -> None:
                    requests = [
                        engine.submit_chat(PROMPT, max_tokens=tg, sampling=greedy_no_eog, **options) for _ in range(8)
                    ]
                    assert all(r.result().completion_tokens == tg for r in requests)

                single[kind].append(tokens_per_second(one, tg))
                engine_runs[kind].append(tokens_per_second(eight, 8 * tg))

    def summary(runs: dict[str, list[float]]) -> dict[str, float]:
        ratios = [c / u for c, u in zip(runs["json_schema"], runs["unconstrained"], strict=True)]
        return {
            "unconstrained_tps": statistics.median(runs["unconstrained"]),
            "json_schema_tps": statistics.median(runs["json_schema"]),
            "ratio": statistics.median(ratios),
        }

    return {"tokens": tg, "single": summary(single), "engine_8": summary(engine_runs)}


def mask_time(model: llamactx.LlamaModel, threads: int) -> dict[str, float]:
    """Median µs per token of llguidance's mask over a full row, along a valid 3-person list."""
    ctx = model.new_context(n_ctx=512, n_threads=threads)
    llamactx.generate(ctx, "Hello", max_tokens=1)
    people = [{"name": f"Person {i}", "age": 20 + i, "city": "Lisbon"} for i in range(3)]
    tokens = model.str_to_token(json.dumps(people), False)
    constraint = llamactx.LlamaSampler.llguidance(model, "json_schema", json.dumps({**PEOPLE, "minItems": 1}))
    reader = llamactx.LlamaSampler.temp(1.0)
    masked, read = [], []
    for token in tokens:
        for sampler, times in ((constraint, masked), (reader, read)):
            candidates = ctx.candidates()
            started = time.perf_counter()
            sampler.apply(candidates)
            times.append(time.perf_counter() - started)
        constraint.accept(token)
    return {
        "tokens": len(tokens),
        "mask_us_per_token": (statistics.median(masked) - statistics.median(read)) * 1e6,
        "apply_us_per_token": statistics.median(masked) * 1e6,
        "read_only_apply_us_per_token": statistics.median(read) * 1e6,
    }


def corpus_outcomes(model: llamactx.LlamaModel, corpus: list[dict[str, Any]], max_tokens: int) -> dict[str, int]:
    outcomes: Counter[str] = Counter()
    with llamactx.Engine(model, n_ctx=8 * 1024, n_seq_max=8) as engine:
        requests = []
        for entry in corpus:
            try:
                request = engine.submit_chat(
                    [("user", entry["prompt"])], max_tokens=max_tokens, json_schema=entry["schema"]
                )
            except llamactx.SchemaError:
                outcomes["refused"] += 1
                continue
            outcomes["compiled"] += 1
            requests.append((entry, request))
        for entry, request in requests:
            try:
                completion = request.result()
            except llamactx.SchemaError:  # the finished value broke a keyword llguidance left to the check
                outcomes["finished"] += 1
                outcomes["refused_after_generating"] += 1
                continue
            if completion.finish_reason == "stop":
                outcomes["finished"] += 1
                outcomes["valid" if valid(completion.text, entry["schema"]) else "invalid"] += 1
    return dict(outcomes)


def valid(text: str, schema: Any) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def peer_outcomes(peer_python: str, model: str, max_tokens: int, limit: int) -> dict[str, int]:
    """The peer's outcome counts over the first ``limit`` schemas; a schema that crashes its
    process counts as "crashed" and the next process goes on after it."""
    script = str(Path(__file__).parent / "peer_llama_cpp_python_schemas.py")
    outcomes: dict[int, str] = {}
    start = 0
    while start < limit:
        command = [peer_python, script, model, str(CORPUS), str(max_tokens), str(start)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            row = json.loads(line)
            outcomes[row["index"]] = row["outcome"]
        crashed = [index for index, outcome in outcomes.items() if outcome == "started"]
        if done.returncode == 0 or not crashed:
            break
        outcomes[crashed[0]] = "crashed"
        start = crashed[0] + 1
    counts = Counter(outcome for index, outcome in outcomes.items() if index < limit)
    counts["compiled"] = sum(counts[o] for o in ("length", "valid", "invalid", "crashed"))
    counts["finished"] = counts["valid"] + counts["invalid"]
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--peer-python")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    model_path = str(llamactx.default_model_path())
    model = llamactx.LlamaModel.load_from_file(model_path)
    corpus = json.loads(CORPUS.read_text())
    rounds, tg, max_tokens = (1, 16, 20) if args.quick else (args.rounds, 128, 160)
    if args.quick:
        corpus = corpus[:8]
    results: dict[str, Any] = {
        "overhead": generation_overhead(model, args.threads, rounds, tg),
        "mask": mask_time(model, args.threads),
        "corpus": {
            "schemas": len(corpus),
            "max_tokens": max_tokens,
            "llamactx": corpus_outcomes(model, corpus, max_tokens),
        },
    }
    if args.peer_python:
        results["corpus"]["llama-cpp-python"] = peer_outcomes(args.peer_python, model_path, max_tokens, len(corpus))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "structured.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
