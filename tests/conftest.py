"""Shared fixtures: the real model (fetched once into the cache) and fresh contexts on it. Helpers
that are not fixtures live in ``support/``."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import background, no_network, synthetic
from support.cpus import threads
from support.decoding import decode_prompt
from support.prompts import PARIS_PROMPT, RERANK_TEMPLATE, TOOL_TEMPLATE

import llamactx

no_network.install()

#: Set in each worker of a parallel run (``pytest -n``, pytest-xdist): ``gw0``, ``gw1``, ...
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
#: A folder where each test's CPU seconds are recorded (``scripts/test_profile.py`` sets it).
CPU_LOG = os.environ.get("LLAMACTX_TEST_CPU_LOG")


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run, each worker keeps to one CPU (worker N to the N-th, round robin), so
    its contexts (and the servers and children it starts, which inherit the affinity) compute
    with one thread each: ggml's threads spin while they wait, so workers with a thread per CPU
    each would oversubscribe the CPUs many times over."""
    config.addinivalue_line(
        "markers", f"{background.MARKER}(*jobs): reads support.background.Jobs, started when the tests are collected"
    )
    if WORKER is not None:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(WORKER.removeprefix("gw")) % len(cpus)]})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``make test``'s serial pass (``-m whole_machine`` and nothing else) imports only the test
    files that name the marker: importing all of them took it seconds (jsonschema's format
    checkers compile a grammar on import, and every file's assertions are rewritten)."""
    if config.option.markexpr != "whole_machine" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "whole_machine" not in collection_path.read_text(encoding="utf-8")


@pytest.hookimpl(trylast=True)  # after the deselection by -k and -m
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Starts the background jobs of the selected tests (in a parallel run, the first worker
    does) and runs those tests last, so that their jobs run beside the other tests. In a parallel
    run: tests marked ``long`` first (so that their modules, which a worker runs whole, start
    first and none runs alone at the end), every worker ordering alike. Tests marked
    ``whole_machine`` need more than one CPU (two compute threads, or pools of several), so a
    worker skips them and ``make test`` runs them in its serial pass (``pytest -m
    whole_machine``)."""
    jobs = {job for item in items for marker in item.iter_markers(background.MARKER) for job in marker.args}
    if WORKER in (None, "gw0") and not config.option.collectonly:
        for job in sorted(jobs, key=lambda job: job.name):
            background.start(job)

    def order(item: pytest.Item) -> tuple[bool, bool]:
        reads_a_job = item.get_closest_marker(background.MARKER) is not None
        return reads_a_job, WORKER is not None and item.get_closest_marker("long") is None

    items.sort(key=order)
    if WORKER is None:
        return
    serial = pytest.mark.skip(reason="needs more than a parallel worker's one CPU: make test runs it serially")
    for item in items:
        if item.get_closest_marker("whole_machine") is not None:
            item.add_marker(serial)


#: A parallel run's id (pytest-xdist's), which names its background jobs' folder.
PARALLEL_RUN = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """A parallel run's controller learns the run's id, whose background folder it removes."""
    node.config.stash[PARALLEL_RUN] = node.workerinput["testrunuid"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The process that scheduled the tests (a parallel run's controller, or the only process)
    removes the run's background folder once every test has read it."""
    if WORKER is None:
        background.remove(session.config.stash.get(PARALLEL_RUN, background.RUN))


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (servers, children
    of crash cases, the Ray suite's process)."""
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """With ``CPU_LOG``, appends each test's CPU seconds (setup, call and teardown, and so a
    module's fixtures with its first test) to a file of this process: what the wall-clock
    durations do not show is which tests keep the CPUs busy."""
    if CPU_LOG is None:
        return (yield)
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        with (Path(CPU_LOG) / f"{os.getpid()}.tsv").open("a") as log:
            log.write(f"{_cpu_seconds() - before:.3f}\t{item.nodeid}\n")


@pytest.fixture(autouse=True)
def no_connection_leaves_loopback() -> Iterator[None]:
    """Fails a test during which this process tried to connect outside loopback (the servers
    the tests start check their own: ``serving.py``)."""
    before = len(no_network.refused)
    yield
    assert no_network.refused[before:] == []


@pytest.fixture(scope="session")
def model_path() -> Path:
    return llamactx.default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> llamactx.LlamaModel:
    return llamactx.LlamaModel.load_from_file(model_path)


@pytest.fixture(scope="session")
def paris(model: llamactx.LlamaModel) -> int:
    """The token of " Paris", the greedy continuation of ``PARIS_PROMPT``."""
    (token,) = model.str_to_token(" Paris", False)
    return token


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic.write_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert.gguf")


@pytest.fixture(scope="session")
def lora_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic.write_lora_for_smollm2(tmp_path_factory.mktemp("adapters") / "lora.gguf")


@pytest.fixture(scope="session")
def reranker_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-architecture reranker made of SmolLM2's first layers, with ``RERANK_TEMPLATE``
    (``synthetic.write_qwen3_reranker``)."""
    path = tmp_path_factory.mktemp("reranker") / "reranker.gguf"
    return synthetic.write_qwen3_reranker(model_path, path, rerank_template=RERANK_TEMPLATE)


@pytest.fixture(scope="session")
def reranker(reranker_path: Path) -> llamactx.LlamaModel:
    return llamactx.LlamaModel.load_from_file(reranker_path)


#: The draft model's layers, of SmolLM2's 30: it agrees with SmolLM2 on about half the tokens
#: it drafts (with 16 or fewer, on almost none).
DRAFT_LAYERS = 26


@pytest.fixture(scope="session")
def draft_model_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 cut to its first ``DRAFT_LAYERS`` layers: a draft model of its vocabulary."""
    path = tmp_path_factory.mktemp("draft") / f"smollm2-first-{DRAFT_LAYERS}.gguf"
    return synthetic.write_first_layers(model_path, path, DRAFT_LAYERS)


@pytest.fixture(scope="session")
def draft_model(draft_model_path: Path) -> llamactx.LlamaModel:
    return llamactx.LlamaModel.load_from_file(draft_model_path)


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def drafting(request: pytest.FixtureRequest) -> llamactx.NgramDraft | llamactx.DraftModel:
    """Each kind of draft (for the speculation tests), at every step, so that every test verifies
    drafts, whatever drafting measures on this machine (the default drafts only where it measured
    faster)."""
    if request.param == "ngram":
        return llamactx.NgramDraft(only_where_faster=False)
    return llamactx.DraftModel(request.getfixturevalue("draft_model"), only_where_faster=False)


@pytest.fixture(scope="session")
def engine(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    """The engine the chat and tool tests share. Two modules define their own, for options this
    one lacks: ``test_engine`` (no prefix cache and a small ``n_batch``: outputs equal
    ``generate``'s) and ``test_server`` (the options of the server it compares with)."""
    with llamactx.Engine(model, n_ctx=4096, n_seq_max=4) as shared:
        yield shared


@pytest.fixture(scope="session")
def native(model: llamactx.LlamaModel) -> Iterator[llamactx.Engine]:
    """An engine whose chat template formats tool calls itself (``TOOL_TEMPLATE``): tools go
    through llama.cpp's own format."""
    with llamactx.Engine(model, n_ctx=4096, n_seq_max=2, chat_template=TOOL_TEMPLATE) as engine:
        yield engine


@pytest.fixture
def ctx(model: llamactx.LlamaModel) -> Iterator[llamactx.LlamaContext]:
    with model.new_context(n_ctx=512, n_batch=512) as context:
        yield context


@pytest.fixture
def paris_ctx(model: llamactx.LlamaModel, ctx: llamactx.LlamaContext) -> llamactx.LlamaContext:
    """A fresh context that has decoded ``PARIS_PROMPT``."""
    decode_prompt(ctx, model.str_to_token(PARIS_PROMPT, False))
    return ctx


@pytest.fixture(scope="session")
def projector_path(model: llamactx.LlamaModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic LLaVA-style projector for SmolLM2 (``synthetic.write_tiny_projector``)."""
    return synthetic.write_tiny_projector(tmp_path_factory.mktemp("projector") / "mmproj.gguf", model.n_embd())


@pytest.fixture(scope="session")
def mtmd(model: llamactx.LlamaModel, projector_path: Path) -> Iterator[llamactx.MtmdContext]:
    with llamactx.MtmdContext(model, projector_path, n_threads=threads()) as projector:
        yield projector
