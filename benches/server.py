"""``llamactx serve`` against llama.cpp's own server (llama-server, run in-process by the PyPI
package ``xllamacpp``) and against llama-cpp-python's server, driven by the same load from the
official ``openai`` client, in one run on one machine:

1. aggregate completion tokens/s and p50 time to first token at 1, 8 and 32 concurrent
   streams (each server with as many slots as streams and 512 cells per slot);
2. the same at 8 streams whose prompts share a long system prompt, new in each round and served
   once (untimed, as to an application's first user) before the round's load;
3. llama-cpp-python's server (one request at a time by design) at 8 streams;
4. speculative decoding by n-gram lookup on both servers (``--spec-ngram`` and llama-server's
   ``ngram-simple``, with the same n-gram and draft sizes) at 1 and 8 streams, on a task whose
   output quotes its prompt (a code block to repeat);
5. the same with a draft model on both (``--draft-model`` and llama-server's ``draft-simple``,
   both with llama.cpp's default draft sizes): SmolLM2 cut to its first layers
   (``benches/speculative.py``'s ``draft_file``), which costs most of what SmolLM2 does, so this
   compares the two servers' handling of a draft model, not a pairing worth using.

Every server gets the same model, threads, slots and greedy requests on /v1/completions (raw
prompts: both sides read the same tokens). For a scenario both servers start once, then it runs
``--rounds`` times: each round serves one untimed warm-up request, then drives the scenario's load
on one server, then the same on the other (which goes first alternates), with prompts new to both
(the round is in them). So the two loads of a round run seconds apart and the machine's drift
cancels; a ratio is the median of the rounds' ratios.

    python benches/server.py --peer-python .venv-peers/bin/python [--threads 2] [--rounds 5]
                             [--out bench-results] [--quick] [--scenario TEXT]

Writes server.json and server.png into --out. Without llama-cpp-python in the peer venv its
scenario is skipped, and the JSON says so; ``--quick`` is a smoke test whose figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import speculative

import llamactx

BENCHES = Path(__file__).resolve().parent
CELLS_PER_SLOT = 512
STARTUP_SECONDS = 120
TOPICS = ["the sea", "a robot", "a city", "the moon", "a forest", "a storm", "a library", "a train"]
SYSTEM_PROMPT = (
    "You are a careful assistant for a travel company. Answer in plain English, be concise, never invent "
    "prices or dates, say when you do not know, and keep a friendly tone. Customers ask about trains, "
    "hotels, museums, food, weather and local customs in European cities. "
) * 6
#: What the speculation scenarios' prompts quote (benches/speculative.py's code block).
CODE = speculative.CODE
#: The n-gram and draft sizes of both servers' speculation.
NGRAM = llamactx.NgramDraft()


@dataclass(frozen=True)
class Scenario:
    name: str
    streams: int
    requests_per_stream: int
    max_tokens: int
    shared_prefix: bool = False
    first_stream: int = 0  # streams are numbered from it
    #: Both servers draft ("ngram": by n-gram lookup; "draft": with a draft model), and each
    #: prompt asks to repeat a code block.
    speculation: str | None = None

    def prompt(self, round_number: int, stream: int, request: int) -> str:
        if self.speculation:
            name = f"total_{round_number}_{stream}_{request}"
            return f"{CODE}\nThe same code, with compute_total renamed to {name}:\n\n"
        topic = TOPICS[(stream + request) % len(TOPICS)]
        story = f"Story {round_number}.{stream}.{request}. Once upon a time, near {topic}, there lived"
        if self.shared_prefix:  # a system prompt no slot holds yet
            return f"Round {round_number}. {SYSTEM_PROMPT}\n\n{story}"
        return story

    @property
    def cells_per_slot(self) -> int:
        # Room for the system prompt or the code block.
        return CELLS_PER_SLOT * 2 if self.shared_prefix or self.speculation else CELLS_PER_SLOT


FULL = [
    Scenario("1 stream", 1, 10, 64),
    Scenario("8 streams", 8, 3, 64),
    Scenario("32 streams", 32, 2, 64),
    Scenario("8 streams, shared system prompt", 8, 3, 32, shared_prefix=True),
    Scenario("1 stream, n-gram speculation", 1, 2, 192, speculation="ngram"),
    Scenario("8 streams, n-gram speculation", 8, 1, 192, speculation="ngram"),
    Scenario("1 stream, draft model", 1, 2, 192, speculation="draft"),
    Scenario("8 streams, draft model", 8, 1, 192, speculation="draft"),
]
QUICK = [Scenario("1 stream", 1, 1, 4), Scenario("2 streams, shared system prompt", 2, 1, 4, shared_prefix=True)]
PEER_SCENARIO_STREAMS = 8  # llama-cpp-python's server is measured at 8 streams
WARM_UP_STREAM = -1  # the warm-up request's prompt is none of the round's


@dataclass
class Load:
    """What one server did with one scenario."""

    tokens: int
    seconds: float
    first_token_seconds: list[float]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def ttft_p50(self) -> float:
        return statistics.median(self.first_token_seconds)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def started(command: list[str], url: str, log: Path) -> Iterator[str]:
    """Runs ``command`` (a server that dies with its stdin; its stderr into ``log``) until
    ``url/v1/models`` answers."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as stderr:
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=2) as api:
                    api.models.list()
                break
            except openai.APIError:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{command[:4]} did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def server_command(
    server: str, model: str, port: int, threads: int, slots: int, ctx: int, peer: Path, speculation: list[str]
) -> list[str]:
    """The command line of ``server``: the same model, port, threads, slots, context and
    ``speculation`` options."""
    where = ["--model", model, "--port", str(port)]
    if server == "llama-cpp-python":  # one request at a time: no slots to set
        tuning = ["--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(ctx)]
        return [str(peer), "-m", "llama_cpp.server", *where, "--host", "127.0.0.1", *tuning,
                "--interrupt_requests", "False", "--verbose", "False"]  # fmt: skip
    program = [sys.executable, "-m", "llamactx", "serve"]
    if server == "llama-server":
        program = [str(peer), str(BENCHES / "peer_xllamacpp_server.py")]
    tuning = ["--threads", str(threads), "--parallel", str(slots), "--ctx", str(ctx)]
    return [*program, *where, *tuning, *speculation]


def end_of_generation_bans(model: str) -> dict[str, int]:
    """``logit_bias`` that bans the model's end-of-generation tokens: every request generates
    exactly ``max_tokens``, on every server."""
    vocabulary = llamactx.LlamaModel.load_from_file(model, vocab_only=True)
    return {str(token): -100 for token in range(vocabulary.n_vocab()) if vocabulary.is_eog_token(token)}


async def drive(url: str, scenario: Scenario, bans: dict[str, int], round_number: int) -> Load:
    """``scenario.streams`` clients, each sending its requests one after another."""
    # A connection per request: llama-server's HTTP library closes kept-alive connections after a
    # few requests, and a client that reuses one as it closes fails the request.
    fresh_connections = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_keepalive_connections=0))
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600, http_client=fresh_connections
    ) as api:
        model = (await api.models.list()).data[0].id
        first_tokens: list[float] = []

        async def one(stream: int, request: int) -> int:
            sent = time.perf_counter()
            chunks = await api.completions.create(
                model=model,
                prompt=scenario.prompt(round_number, stream, request),
                max_tokens=scenario.max_tokens,
                temperature=0,
                logit_bias=bans,
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces, reported = 0, None
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].text:
                    if not pieces:
                        first_tokens.append(time.perf_counter() - sent)
                    pieces += 1
                if chunk.usage is not None:
                    reported = chunk.usage.completion_tokens
            return reported if reported is not None else pieces

        async def client(stream: int) -> int:
            return sum([await one(stream, request) for request in range(scenario.requests_per_stream)])

        began = time.perf_counter()
        streams = range(scenario.first_stream, scenario.first_stream + scenario.streams)
        tokens = sum(await asyncio.gather(*(client(stream) for stream in streams)))
        return Load(tokens, time.perf_counter() - began, first_tokens)


@dataclass
class Setup:
    """What every measurement shares: the model, threads, the peers' interpreter, where server
    logs go, and the end-of-generation bans."""

    model: str
    threads: int
    peer: Path
    logs: Path
    bans: dict[str, int]
    #: The draft model of the "draft" scenarios.
    draft: Path

    @contextmanager
    def serving(self, server: str, scenario: Scenario) -> Iterator[str]:
        """A fresh ``server`` with one slot per stream; its URL."""
        port = free_port()
        slots = scenario.streams
        cells = slots * scenario.cells_per_slot
        drafting = self.drafting(server, scenario)
        command = server_command(server, self.model, port, self.threads, slots, cells, self.peer, drafting)
        with started(command, f"http://127.0.0.1:{port}", self.log(server, scenario)) as url:
            yield url

    def load(self, server: str, url: str, scenario: Scenario, round_number: int) -> Load:
        """One warm-up request (first decodes, caches, pools; the round's system prompt), then
        the round's load."""
        try:
            asyncio.run(drive(url, warm_up(scenario), self.bans, round_number))
            return asyncio.run(drive(url, scenario, self.bans, round_number))
        except openai.APIError as error:
            log = self.log(server, scenario)
            raise SystemExit(f"{server} failed in {scenario.name!r} ({error}); its log: {log}") from error

    def drafting(self, server: str, scenario: Scenario) -> list[str]:
        """``server``'s options for the speculation of ``scenario``: the same for both servers."""
        if scenario.speculation == "ngram":
            sizes = [str(NGRAM.size_ngram), str(NGRAM.size_mgram)]
            if server == "llama-server":
                return ["--spec-ngram", *sizes]
            return ["--spec-ngram", "--spec-ngram-size-n", sizes[0], "--spec-ngram-size-m", sizes[1]]
        if scenario.speculation == "draft":
            return ["--draft-model", str(self.draft)]
        return []

    def log(self, server: str, scenario: Scenario) -> Path:
        """Where ``server``'s stderr goes while it serves ``scenario``."""
        return self.logs / f"{server} {scenario.name}.log"


def replace_count(scenario: Scenario, streams: int, requests: int) -> Scenario:
    return replace(scenario, streams=streams, requests_per_stream=requests, max_tokens=min(scenario.max_tokens, 8))


def warm_up(scenario: Scenario) -> Scenario:
    """One short request whose prompt is the round's (its system prompt too), but for a
    stream that none of the round's requests is from."""
    return replace(replace_count(scenario, 1, 1), first_stream=WARM_UP_STREAM)


def peer_has(peer: Path, module: str) -> bool:
    return subprocess.run([str(peer), "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def run(
    model: str,
    peer: Path,
    threads: int,
    scenarios: list[Scenario],
    rounds: int,
    out: Path,
    *,
    with_python_peer: bool,
    quick: bool,
) -> dict[str, Any]:
    draft = speculative.draft_file(Path(model), out / "models")
    setup = Setup(model, threads, peer, out / "logs", end_of_generation_bans(model), draft)
    results: dict[str, Any] = {"threads": threads, "rounds": rounds, "scenarios": {}, "skipped": []}
    comparisons = [(scenario, "llama-server", rounds) for scenario in scenarios]
    if with_python_peer and peer_has(peer, "llama_cpp.server"):
        scenario = Scenario("8 streams vs llama-cpp-python", PEER_SCENARIO_STREAMS, 2, 64)
        comparisons.append((replace_count(scenario, 2, 1) if quick else scenario, "llama-cpp-python", 1))
    elif with_python_peer:
        results["skipped"].append("llama-cpp-python's server: not installed in the peer venv (make bench-peers)")
    out.mkdir(parents=True, exist_ok=True)
    for scenario, peer_server, scenario_rounds in comparisons:
        rows: dict[str, list[Load]] = {"llamactx": [], peer_server: []}
        with ExitStack() as servers:
            urls = {server: servers.enter_context(setup.serving(server, scenario)) for server in rows}
            for round_number in range(scenario_rounds):
                order = list(rows) if round_number % 2 == 0 else list(reversed(rows))
                for server in order:
                    rows[server].append(setup.load(server, urls[server], scenario, round_number))
        results["scenarios"][scenario.name] = summary(scenario, rows)
        print(json.dumps({scenario.name: results["scenarios"][scenario.name]["ratios"]}), flush=True)
        (out / "server.json").write_text(json.dumps(results, indent=2))  # a failure later keeps these
    chart(results, out / "server.png")
    return results


def summary(scenario: Scenario, rows: dict[str, list[Load]]) -> dict[str, Any]:
    ours, (peer_name, theirs) = rows["llamactx"], next((k, v) for k, v in rows.items() if k != "llamactx")
    pairs = list(zip(ours, theirs, strict=True))
    return {
        "scenario": asdict(scenario),
        "peer": peer_name,
        "tokens_per_second": {name: [load.tokens_per_second for load in loads] for name, loads in rows.items()},
        "ttft_p50_seconds": {name: [load.ttft_p50 for load in loads] for name, loads in rows.items()},
        "ratios": {
            "aggregate tokens/s (ours / theirs)": statistics.median(
                a.tokens_per_second / b.tokens_per_second for a, b in pairs
            ),
            "p50 time to first token (ours / theirs)": statistics.median(a.ttft_p50 / b.ttft_p50 for a, b in pairs),
        },
    }


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["scenarios"])
    throughput = [results["scenarios"][n]["ratios"]["aggregate tokens/s (ours / theirs)"] for n in names]
    latency = [results["scenarios"][n]["ratios"]["p50 time to first token (ours / theirs)"] for n in names]
    figure, axis = plt.subplots(figsize=(9, 4))
    positions = range(len(names))
    axis.barh([p + 0.2 for p in positions], throughput, height=0.4, label="aggregate tokens/s (higher is better)")
    axis.barh([p - 0.2 for p in positions], latency, height=0.4, label="p50 time to first token (lower is better)")
    axis.axvline(1.0, color="black", linewidth=0.8)
    labels = [n if " vs " in n else f"{n}\nvs {results['scenarios'][n]['peer']}" for n in names]
    axis.set_yticks(list(positions), labels, fontsize=8)
    axis.set_xlabel(f"llamactx serve / peer ({results['threads']} threads, median of {results['rounds']} rounds)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", type=Path, required=True, help="the venv of `make bench-peers`")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--scenario", default="", help="only the scenarios whose name holds this text")
    arguments = parser.parse_args()
    if not peer_has(arguments.peer_python, "xllamacpp"):
        raise SystemExit(f"{arguments.peer_python} has no xllamacpp: run `make bench-peers`")
    model = str(llamactx.default_model_path())
    run(
        model,
        arguments.peer_python,
        arguments.threads,
        [scenario for scenario in (QUICK if arguments.quick else FULL) if arguments.scenario in scenario.name],
        arguments.rounds,
        arguments.out,
        with_python_peer=arguments.scenario in "8 streams vs llama-cpp-python",
        quick=arguments.quick,
    )


if __name__ == "__main__":
    main()
