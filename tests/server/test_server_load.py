"""The server under load and faults: 32 streaming clients at once for 20 seconds (a minute or
more with ``LLAMACTX_SERVER_LOAD_SECONDS``), a quarter of their requests abandoned mid-stream.
What is not abandoned must be exactly right, and what is must leave nothing behind (no running
sequence, no KV cell held, no memory growth)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import openai
import pytest
from support.serving import ENGINE_OPTIONS, MODEL_ID, Server, running_server

import llamactx

CLIENTS = 32
SECONDS = float(os.environ.get("LLAMACTX_SERVER_LOAD_SECONDS", "20"))
ABANDONED = 0.25
# Prompts of different lengths and lengths of reply: slots free and fill at different steps.
JOBS = [
    ("The capital of France is", 24),
    ("Once upon a time, in a small village by the sea,", 48),
    ("def fibonacci(n):", 32),
    ("The three primary colors are", 16),
    ("Water boils at", 8),
    ("In 1969, the first person to walk on the Moon", 40),
    ("A haiku about autumn:", 20),
    ("The quick brown fox", 12),
]
# RSS may grow while allocators warm up; past the first quarter it must stay within this.
RSS_GROWTH_BYTES = 48 * 2**20


async def _client_loop(
    server: Server, seed: int, deadline: float, expected: list[str], outcomes: dict[str, int], rss: list[int]
) -> None:
    rng = random.Random(seed)
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as api:
        while time.monotonic() < deadline:
            job = rng.randrange(len(JOBS))
            prompt, max_tokens = JOBS[job]
            stream = await api.completions.create(
                model=MODEL_ID, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            if rng.random() < ABANDONED:
                leave_after = rng.randint(1, 6)
                async for _ in stream:
                    leave_after -= 1
                    if leave_after == 0:
                        break
                await stream.close()
                outcomes["abandoned"] += 1
                continue
            text, finish, usage = [], None, None
            async for chunk in stream:
                for choice in chunk.choices:
                    text.append(choice.text)
                    finish = choice.finish_reason or finish
                usage = chunk.usage or usage
            assert "".join(text) == expected[job], (prompt, "".join(text), expected[job])
            assert finish in {"stop", "length"}
            assert usage is not None
            assert usage.completion_tokens <= max_tokens
            outcomes["completed"] += 1
            if seed == 0 and len(rss) == 1 and time.monotonic() > deadline - 0.75 * SECONDS:
                rss.append(server.rss_bytes())


@pytest.mark.long
def test_32_streaming_clients_with_abandoned_streams(model_path: Path, model: llamactx.LlamaModel) -> None:
    with llamactx.Engine(model, **ENGINE_OPTIONS) as engine:
        expected = [engine.submit(prompt, max_tokens=n).result(60).text for prompt, n in JOBS]
    with running_server(model_path, "--no-prefix-cache") as server:
        rss = [server.rss_bytes()]
        outcomes = {"completed": 0, "abandoned": 0}
        deadline = time.monotonic() + SECONDS

        async def load() -> None:
            await asyncio.gather(
                *(_client_loop(server, seed, deadline, expected, outcomes, rss) for seed in range(CLIENTS))
            )

        asyncio.run(load())
        server.wait_until_idle()
        metrics = server.metrics()
        after = server.rss_bytes()
    assert outcomes["completed"] >= CLIENTS, outcomes
    assert outcomes["abandoned"] > 0, outcomes
    assert metrics["llamactx_engine_kv_cells_used"] == 0
    assert len(rss) == 2, "no RSS reading after the warm-up"
    assert after - rss[1] < RSS_GROWTH_BYTES, f"RSS grew from {rss[1] >> 20} MiB to {after >> 20} MiB"
    served = sum(value for name, value in metrics.items() if name.startswith("llamactx_requests_total{"))
    assert served >= outcomes["completed"] + outcomes["abandoned"]
    assert not any('status="5' in name for name in metrics), metrics


@pytest.mark.parametrize("abandon", [True, False])
def test_the_last_stream_leaves_no_cells_behind(model_path: Path, abandon: bool) -> None:
    """Also with the prefix cache on: its kept cells count as cached, never as used."""
    with running_server(model_path) as server:

        async def one() -> None:
            async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as api:
                stream = await api.completions.create(
                    model=MODEL_ID, prompt=JOBS[1][0], max_tokens=64, temperature=0, stream=True
                )
                async for _ in stream:
                    if abandon:
                        break
                await stream.close()

        asyncio.run(one())
        server.wait_until_idle()
        assert server.metrics()["llamactx_engine_kv_cells_cached"] > 0
