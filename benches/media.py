"""Images, in one run, on SmolLM2 with the tests' synthetic LLaVA-style projector (no real vision
model is small enough to ship on PyPI; this one is a 64x64, 16-token vision tower):

- "encode + first token": reading a chat prompt with one image (the projector encodes it, the
  model decodes its embeddings and the text) and sampling the first token, by llamactx
  (``MtmdContext.eval_chunks``) and by llama.cpp's ``llama-mtmd-cli`` (built with the extension
  from the same bundled source), on the same model, projector, image and threads. The CLI's time
  is what it logs: its projector's encode ("mtmd batch encoding done in N ms") plus llama.cpp's
  prompt eval time (text and image embeddings); ours is the wall time of ``eval_chunks`` and the
  first sample. Both warm (the CLI warms the model up; ours reads one other image first), a new
  image each round (the projector keeps encodings by image).
- "8 image chats": eight chats, each with its own image, through one ``Engine(mtmd=...)`` at once
  against the same eight one after another on the same engine: the aggregate replies' tokens/s.

    python benches/media.py [--rounds 5] [--threads 2] [--out bench-results]

Writes media.json into --out; ratios are medians of the rounds' ratios (> 1: llamactx, or the
concurrent chats, faster).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import llamactx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import synthetic  # the tests' GGUF writers
from support.images import data_url, picture, png
from support.processes import built_mtmd_cli

QUESTION = "What is in this image?"
ENCODED = re.compile(r"mtmd batch encoding done in (\d+) ms")
PROMPT_EVAL = re.compile(r"prompt eval time =\s+([0-9.]+) ms")


def cli_seconds(cli: Path, model_path: Path, projector: Path, image: Path, threads: int) -> float:
    """llama-mtmd-cli's encode + prompt eval time for the image and the question, in seconds."""
    ran = subprocess.run(
        [
            *(str(cli), "-m", str(model_path), "--mmproj", str(projector), "--image", str(image), "-p", QUESTION),
            *("-n", "1", "--temp", "0", "-t", str(threads), "-c", "512", "-lv", "4", "--perf"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    encoded = ENCODED.search(ran.stderr)
    prompt_eval = PROMPT_EVAL.search(ran.stderr)
    if encoded is None or prompt_eval is None:
        raise RuntimeError(f"llama-mtmd-cli logged no timings:\n{ran.stderr[-2000:]}")
    return (float(encoded.group(1)) + float(prompt_eval.group(1))) / 1000


def ours_seconds(model: llamactx.LlamaModel, mtmd: llamactx.MtmdContext, image: np.ndarray, threads: int) -> float:
    """llamactx's encode + prompt eval + first sample for the same prompt, in seconds."""
    rendered = model.apply_chat_template([("user", f"{mtmd.marker()}{QUESTION}")], None, True)
    with model.new_context(n_ctx=512, n_threads=threads, n_threads_batch=threads) as ctx:
        warm = mtmd.tokenize(rendered, [llamactx.MtmdBitmap.from_rgb(picture(999))])
        mtmd.eval_chunks(ctx, warm, 0, 0)
        ctx.clear_kv_cache()
        chunks = mtmd.tokenize(rendered, [llamactx.MtmdBitmap.from_rgb(image)], add_special=model.add_bos_token())
        started = time.perf_counter()
        mtmd.eval_chunks(ctx, chunks, 0, 0)
        llamactx.LlamaSampler.greedy().sample(ctx, -1)
        return time.perf_counter() - started


def chat_messages(seed: int) -> list[dict[str, object]]:
    url = data_url(picture(seed))
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": f"Image {seed}: {QUESTION}"}]
    return [{"role": "user", "content": parts}]


def chats_ratio(engine: llamactx.Engine, seeds: range, max_tokens: int) -> float:
    """Tokens/s of the chats submitted at once over the same chats one after another."""
    started = time.perf_counter()
    alone = [engine.submit_chat(chat_messages(seed), max_tokens=max_tokens).result() for seed in seeds]
    one_at_a_time = sum(len(completion.tokens) for completion in alone) / (time.perf_counter() - started)
    started = time.perf_counter()
    requests = [engine.submit_chat(chat_messages(seed), max_tokens=max_tokens) for seed in seeds]
    together = sum(len(request.result().tokens) for request in requests) / (time.perf_counter() - started)
    return together / one_at_a_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    cli = built_mtmd_cli()
    if cli is None:
        raise SystemExit("llama-mtmd-cli is built with the extension (make build); none found")
    model_path = llamactx.default_model_path()
    model = llamactx.LlamaModel.load_from_file(model_path)
    results: dict[str, object] = {"threads": arguments.threads, "rounds": arguments.rounds}
    with tempfile.TemporaryDirectory() as folder:
        projector = synthetic.write_tiny_projector(Path(folder) / "mmproj.gguf", model.n_embd())
        with llamactx.MtmdContext(model, projector, n_threads=arguments.threads, warmup=True) as mtmd:
            ratios, cli_times, our_times = [], [], []
            for round_number in range(arguments.rounds):
                image = picture(100 + round_number)
                (Path(folder) / "image.png").write_bytes(png(image))
                theirs = cli_seconds(cli, model_path, projector, Path(folder) / "image.png", arguments.threads)
                ours = ours_seconds(model, mtmd, image, arguments.threads)
                cli_times.append(theirs)
                our_times.append(ours)
                ratios.append(theirs / ours)
                print(
                    f"encode + first token, round {round_number + 1}: llama-mtmd-cli {theirs * 1000:.1f} ms, "
                    f"llamactx {ours * 1000:.1f} ms",
                    flush=True,
                )
            results["encode_first_token"] = {
                "llama_mtmd_cli_ms": [round(t * 1000, 2) for t in cli_times],
                "llamactx_ms": [round(t * 1000, 2) for t in our_times],
                "speed_ratio_vs_cli": statistics.median(ratios),
            }
            options = {"n_ctx": 4096, "n_seq_max": 8, "n_threads": arguments.threads, "prefix_cache": False}
            with llamactx.Engine(model, mtmd=mtmd, **options) as engine:
                concurrent = [
                    chats_ratio(engine, range(200 + 8 * n, 208 + 8 * n), arguments.max_tokens)
                    for n in range(arguments.rounds)
                ]
            results["eight_image_chats"] = {
                "rounds": concurrent,
                "ratio_at_once_vs_one_at_a_time": statistics.median(concurrent),
            }
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "media.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
